"""Every defect issue 41's audit listed is a case of this suite: the table names the test that
attacks it, and fails when that test is gone or renamed. The log-input defects (a NUL hole, CR
endings, blank-line floods, incidents days apart, a log's control characters) are the log
readers' and are tested beside them (tests/unit/logs, issue 38)."""

from __future__ import annotations

import importlib

import pytest

DEFECTS = {
    "run --hang-timeout 0.01 reports hang C, culprit rank 0": [
        "test_hostile_runs::test_a_hang_timeout_below_what_the_watch_sees_never_blames_a_rank",
        "test_policies::test_a_hang_needs_a_live_rank_and_never_the_watchs_own_clock",
        "test_policies::test_a_hang_timeout_shorter_than_the_watch_can_see_is_raised_with_a_note",
    ],
    "a full disk mid-run: exit 1, 0-byte launcher.json, no verdict.json, report refuses": [
        "test_hostile_runs::test_a_disk_that_fills_mid_run_leaves_an_undecided_verdict",
        "test_hostile_runs::test_a_file_size_limit_mid_run_leaves_an_undecided_verdict",
        "test_hostile_files::test_report_reads_any_hostile_evidence_file",  # launcher.json:empty
    ],
    "report --summary RUN/script.json --force; a symlink into RUN/stacks/": [
        "test_outputs::test_force_never_reaches_evidence_through_any_path_or_link",
    ],
    "two report --plots SAME at once both exit 0": [
        "test_hostile_runs::test_two_reports_on_one_folder_never_both_write",
        "test_hostile_runs::test_two_runs_on_one_out_never_both_write",
        "test_outputs::test_an_output_another_invocation_holds_is_refused_naming_it",
    ],
    "--storage-dir writes L3 pages into another run's dir": [
        "test_outputs::test_storage_dir_never_inside_another_runs_dir",
    ],
    "export reads every sibling run dir (FIFO hangs, damaged exits 1, 300 quoted)": [
        "test_hostile_files::test_export_never_reads_the_run_dirs_beside_it",
        "test_hostile_files::test_export_reads_any_hostile_evidence_file",
    ],
    "bisect: Ctrl-C just after the last trial exits 130 with no table": [
        "test_hostile_runs::test_bisect_ctrl_c_as_the_last_trial_ends_still_prints_the_table",
    ],
    "bisect: Ctrl-C with --jobs 2 writes concluded: true, no failures in 0 trials": [
        "test_hostile_runs::test_bisect_ctrl_c_before_any_trial_ends_concludes_nothing",
        "test_policies::test_bisect_interrupted_before_any_trial_concludes_nothing",
    ],
    "run --check calls an undecided run a regression (exit 4)": [
        "test_policies::test_check_never_calls_an_undecided_run_a_mismatch",
    ],
    "[expect] tables that can never match, contradictory rate bounds": [
        "test_policies::test_an_expect_table_that_can_never_match_is_refused_at_parse_time",
    ],
    "deeply nested JSON in any evidence file: RecursionError": [
        "test_hostile_files::test_report_reads_any_hostile_evidence_file",
        "test_hostile_files::test_a_deep_json_line_among_good_steps_is_damage_said_in_one_line",
    ],
    "a file name over 255 bytes: Errno 36": [
        "test_policies::test_a_too_long_name_is_one_line_not_errno_36",
        "test_hostile_files::test_every_path_input_refuses_a_hostile_path_in_one_line",
        "test_hostile_files::test_every_output_flag_refuses_a_hostile_path_in_one_line",
    ],
    "a symlink loop for --logs / --dumps": [
        "test_hostile_files::test_every_path_input_refuses_a_hostile_path_in_one_line",
    ],
    "wrong types in launcher.json": [
        "test_hostile_files::test_wrong_types_in_launcher_json_are_named",
    ],
    "a bad MPLBACKEND": ["test_hostile_runs::test_a_bad_mplbackend_never_stops_the_plots"],
    "--pid 2 (alive) reported no such process": [
        "test_hostile_runs::test_triage_of_a_live_kernel_thread_is_not_no_such_process",
    ],
    "--ssh-config /dev/zero blamed on the host": [
        "test_policies::test_ssh_config_that_is_a_device_is_blamed_on_the_file",
        "test_hostile_files::test_every_path_input_refuses_a_hostile_path_in_one_line",
    ],
    "terminal escape sequences from verdict.json reach the terminal raw": [
        "test_policies::test_escape_sequences_from_verdict_json_never_reach_the_terminal",
    ],
    "COLUMNS=0 prints nothing": [
        "test_hostile_runs::test_columns_zero_on_a_terminal_still_prints",
        "test_policies::test_a_bad_terminal_size_is_dropped_and_said",
    ],
    "HICACHE_DIAG_RECORD=OFF passes the env check and recording stays on": [
        "test_policies::test_recording_off_reads_the_same_in_the_check_and_the_recorder",
        "test_policies::test_a_recording_switch_neither_on_nor_off_is_refused",
    ],
    "faults that never fired shown as faults injected": [
        "test_policies::test_faults_that_never_fired_are_not_called_injected",
    ],
    "a flag given twice silently keeps the last": [
        "test_policies::test_a_flag_given_twice_is_refused_never_the_last_kept",
        "test_policies::test_an_alias_given_beside_its_option_is_the_same_option_twice",
    ],
    "every refusal under --json leaves stdout empty": [
        "test_policies::test_every_refusal_under_json_is_one_json_document",
        "test_policies::test_a_refusal_in_the_command_itself_is_one_json_document",
    ],
    "SIGHUP leaves no verdict.json": [
        "test_hostile_runs::test_sighup_mid_run_leaves_a_verdict_naming_it",
        "test_hostile_runs::test_a_stop_signal_at_a_seeded_point",
    ],
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_defect_of_the_audit_is_a_case_here(defect):
    for ref in DEFECTS[defect]:
        module, name = ref.split("::")
        found = importlib.import_module(f"tests.hostile.{module}")
        assert callable(getattr(found, name, None)), f"{defect}: no test {ref}"
