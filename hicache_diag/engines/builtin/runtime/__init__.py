"""A compact multi-process PP + HiCache runtime mirroring python/sglang/srt/."""
