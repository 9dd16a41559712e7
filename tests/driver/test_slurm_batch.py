"""What ``raystudy slurm`` reads from ``sinfo`` before it submits: hand-written sinfo lines
(``sinfo -h -N -o '%N %P %G'``: a line per node and partition)."""

from __future__ import annotations

import pytest

from raystudy.driver.slurm_batch import check_partition, gpu_count, partition_nodes
from raystudy.errors import ConfigError

# gpu: two 4-GPU nodes and one 8-GPU node; cpu* (the default): two nodes without GPUs, one of
# them (c2) also in gpu's neighbour "long"
SINFO = """\
g1 gpu gpu:a100:4(S:0-1)
g2 gpu gpu:4
g3 gpu gpu:h100:8,shard:16
c1 cpu* (null)
c2 cpu* (null)
c2 long (null)
"""


@pytest.mark.parametrize(
    "gres,n",
    [("gpu:4", 4), ("gpu:a100:8(S:0-1)", 8), ("(null)", 0), ("gpu:a100:2,gpu:v100:1", 3), ("shard:16", 0)],
)
def test_gpu_count_reads_each_gres_form(gres, n):
    assert gpu_count(gres) == n


def test_partition_nodes_reads_the_named_or_the_default_partition():
    assert partition_nodes(SINFO, "gpu") == (
        "gpu",
        {"g1": "gpu:a100:4(S:0-1)", "g2": "gpu:4", "g3": "gpu:h100:8,shard:16"},
    )
    assert partition_nodes(SINFO, None) == ("cpu", {"c1": "(null)", "c2": "(null)"})
    assert partition_nodes(SINFO, "long") == ("long", {"c2": "(null)"})


def test_an_unknown_partition_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"^--partition nope: no such partition; sinfo knows cpu, gpu, long$"):
        partition_nodes(SINFO, "nope")
    with pytest.raises(ConfigError, match=r"^--partition None: no such partition; sinfo knows gpu$"):
        partition_nodes("g1 gpu gpu:4\n", None)  # no default partition


def test_what_the_partition_holds_passes():
    check_partition("gpu", 3, 8, SINFO)  # the 8-GPU node is one of three
    check_partition(None, 2, 0, SINFO)
    check_partition("nope", 1, 0, SINFO)  # one node, no GPUs: nothing to check, sbatch says the rest
    check_partition("gpu", 64, 8, None)  # sinfo cannot say: sbatch will


def test_more_gpus_per_node_than_any_node_has_is_refused():
    with pytest.raises(ConfigError) as e:
        check_partition("gpu", 1, 9, SINFO)
    assert str(e.value) == (
        "--gpus-per-node 9: the nodes of partition gpu have at most 8 GPUs (sinfo: gpu:h100:8,shard:16); "
        "ask for 8 or fewer, or another partition"
    )
    with pytest.raises(ConfigError, match=r"^--gpus-per-node 1: the nodes of partition cpu have no GPUs \(sinfo: "):
        check_partition(None, 1, 1, SINFO)


def test_more_nodes_than_the_partition_has_is_refused():
    with pytest.raises(ConfigError) as e:
        check_partition(None, 3, 0, SINFO)
    assert str(e.value) == (
        "--nodes 3: partition cpu has 2 nodes (sinfo: c1, c2); ask for 2 or fewer, or another partition"
    )
    with pytest.raises(ConfigError, match=r"^--nodes 2: partition long has 1 node \(sinfo: c2\)"):
        check_partition("long", 2, 0, SINFO)
