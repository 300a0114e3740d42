"""Executors without a cluster: the commands each builds, auto-detection, kubectl's output as
kubectl prints it (the table layouts of real `kubectl get pods` captures from public docs and
threads: -o wide, --all-namespaces, `pod/` rows, RESTARTS with `(3m52s ago)`), and the merge of
a collector document. kubectl never ran against a cluster here: none can run on this machine."""

from __future__ import annotations

import pytest

from hicache_diag.cluster.base import BOOTSTRAP, MARKER, Node, NodeResult, Sampling, collector_args
from hicache_diag.cluster.detect import ClusterFlags, detect, executor_for
from hicache_diag.cluster.kubectl import KubectlExecutor, parse_pods
from hicache_diag.cluster.slurm import SlurmExecutor
from hicache_diag.cluster.ssh import SshExecutor
from hicache_diag.errors import UsageError
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.cluster_merge import merge

WIDE = """\
NAME                      READY   STATUS    RESTARTS        AGE   IP            NODE     NOMINATED NODE   READINESS GATES
sglang-leader-0           1/1     Running   2 (3m52s ago)   30m   10.1.131.5    gpu-01   <none>           <none>
sglang-worker-0-1         1/1     Running   0               34h   10.1.73.131   gpu-02   <none>           <none>
sglang-worker-0-2         0/1     CrashLoopBackOff   1      8s    10.1.73.132   gpu-03   <none>           <none>
"""  # noqa: E501 - kubectl's own line width
ALL_NS = """\
NAMESPACE   NAME                READY   STATUS              RESTARTS   AGE
llm         sglang-leader-0     1/1     Running             0          5d
llm         sglang-worker-0-1   0/1     ContainerCreating   0          11m
"""
PREFIXED = """\
NAME                          READY   STATUS    RESTARTS   AGE
pod/sglang-leader-0           1/1     Running   0          46s
"""


def test_kubectl_tables_as_kubectl_prints_them():
    assert parse_pods(WIDE) == [
        ("sglang-leader-0", "Running"),
        ("sglang-worker-0-1", "Running"),
        ("sglang-worker-0-2", "CrashLoopBackOff"),
    ]
    assert parse_pods(ALL_NS)[1] == ("sglang-worker-0-1", "ContainerCreating")
    assert parse_pods(PREFIXED) == [("sglang-leader-0", "Running")]
    assert parse_pods("") == []


def test_kubectl_picks_running_pods_and_builds_exec():
    ex = KubectlExecutor(selector="app=sglang", namespace="llm", container="server")
    assert ex.get_pods_argv() == ["kubectl", "get", "pods", "-n", "llm", "-l", "app=sglang"]
    nodes = ex.pods_from(0, WIDE, "")
    assert [n.name for n in nodes] == ["sglang-leader-0", "sglang-worker-0-1"]
    argv = ex.argv(nodes[0], ["python3", "-c", "X"])
    head = ["kubectl", "exec", "-i", "-n", "llm", "sglang-leader-0", "-c", "server", "--"]
    assert argv == [*head, "python3", "-c", "X"]


def test_kubectl_bad_input_is_one_line():
    ex = KubectlExecutor(selector="app=nope")
    with pytest.raises(UsageError, match="no running pod"):
        ex.pods_from(0, "", "No resources found in default namespace.")
    with pytest.raises(UsageError, match="Unauthorized"):
        ex.pods_from(1, "", "error: You must be logged in to the server (Unauthorized)")
    err = 'Error from server (NotFound): pods "sglang-9" not found'
    assert ex.explain(Node("sglang-9", "sglang-9"), 1, err) == "kubectl sglang-9: pod not found"


def test_ssh_and_slurm_commands(tmp_path):
    cfg = tmp_path / "cfg"
    cfg.write_text("Host node-2\n")  # the executor checks the file is there and readable
    node = Node("node-2", "node-2")
    remote = collector_args(node, Sampling(at=100.0), 1234)
    assert remote[:5] == ["python3", "-c", BOOTSTRAP, "1234", MARKER]
    argv = SshExecutor(nodes=[node], config=str(cfg)).argv(node, remote)
    assert argv[:3] == ["ssh", "-F", str(cfg)] and "BatchMode=yes" in argv
    assert argv[-2] == "node-2" and argv[-1].startswith("python3 -c 'import sys")
    srun = SlurmExecutor(jobid="42").argv(Node("c1", "c1"), remote)
    assert srun[:6] == ["srun", "--overlap", "--jobid", "42", "--nodelist", "c1"]
    assert srun[-len(remote) :] == remote


@pytest.mark.parametrize(
    ("target", "env", "via"),
    [
        (ClusterFlags(hosts="a,b"), {}, "ssh"),
        (ClusterFlags(jobid="7"), {}, "slurm"),
        (ClusterFlags(), {"SLURM_JOB_ID": "7"}, "slurm"),
        (ClusterFlags(selector="app=sglang"), {}, "kubectl"),
        (ClusterFlags(), {}, "local"),
        (ClusterFlags(via="ssh", hosts="a"), {"SLURM_JOB_ID": "7"}, "ssh"),
        (ClusterFlags(hosts="a"), {"SLURM_JOB_ID": "7"}, "ssh"),  # a flag beats the environment
    ],
)
def test_auto_detection(target, env, via):
    assert detect(target, env) == via


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (ClusterFlags(hosts="a", jobid="7"), "give --via"),
        (ClusterFlags(via="rsh"), "choose one of"),
        (ClusterFlags(via="ssh"), "needs --hosts"),
        (ClusterFlags(via="slurm"), "--jobid ''"),
        (ClusterFlags(via="kubectl"), "needs --selector"),
        (ClusterFlags(hosts="a,,b"), "--hosts"),
        (ClusterFlags(hosts="a,a"), "named twice"),
        (ClusterFlags(via="slurm", jobid="7", ssh_config="x"), "--ssh-config is for --via ssh"),
    ],
)
def test_bad_cluster_flags_are_usage_errors(target, message):
    with pytest.raises(UsageError, match=message):
        executor_for(target, {})


def _doc(node: str, title: str, state: str, threads: list | None) -> dict:
    sample = {"t": 10.0, "threads": threads, "links": [], "proc": {"state": state}}
    proc = {"pid": 7, "title": title, "samples": [sample, dict(sample, t=10.5)]}
    return {"node": node, "at": 10.0, "samples_at": [10.0, 10.5], "processes": [proc]}


def test_merge_puts_the_node_in_every_rank_and_keeps_the_missing_apart():
    frames = [{"thread_name": "MainThread", "frames": [{"name": "f", "filename": "a.py"}]}]
    answered = [
        NodeResult(Node("node-1", "h1"), _doc("node-1", "sglang::scheduler_PP0_TP0", "S", frames)),
        NodeResult(Node("node-2", "h2"), _doc("node-2", "sglang::scheduler_PP1_TP0", "T", None)),
    ]
    gone = NodeResult(Node("node-3", "h3"), error="ssh h3: connection refused")
    snap = merge([*answered, gone])
    assert [rs.rank.label for rs in snap.ranks] == ["node-1 PP0 TP0", "node-2 PP1 TP0"]
    assert snap.ranks[1].fate is RankFate.STOPPED and "state T" in snap.ranks[1].error
    assert [r.node.name for r in snap.missing] == ["node-3"]
    assert snap.skew_s is None or snap.skew_s == 0.0
