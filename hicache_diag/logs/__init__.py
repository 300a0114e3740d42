"""What a server printed, as it reached us: lines undone from their carriers and paste damage,
tracebacks, faulthandler dumps, crash texts and the bounded evidence a log stream leaves. Read
by triage (any log) and by diagnosis (a run's rank logs) alike."""
