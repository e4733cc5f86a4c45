"""cluster.json: both forms give the same spec; every bad file gives one clear line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.clusterjson import load_cluster_spec, parse_cluster_spec
from cluster.errors import ClusterSpecError
from cluster.slurm.section import SlurmSpec
from cluster.spec import BlobMount, ElasticSpec, local_spec
from tests.conftest import REPO_ROOT
from tests.support.clusterspecs import ACCOUNT_KEY, LEGACY_TUTORIAL
from tiling.runtime.machine import local_cpu_count, local_gpu_count

REPO_CLUSTER_JSON = REPO_ROOT / "cluster.json"
# The shape of the original Batch AI tutorial's cluster.json.
FLAT_TUTORIAL: dict[str, Any] = {
    "vmSize": "Standard_NC6",
    "vmPriority": "dedicated",
    "targetNodeCount": 2,
    "mounts": [
        {"accountName": "landcoverdata", "containerName": "chips", "relativeMountPath": "bfs"}
    ],
    "setupCommand": "pip install landcover",
}


def test_legacy_and_flat_forms_give_the_same_spec() -> None:
    legacy = parse_cluster_spec(LEGACY_TUTORIAL)
    flat = parse_cluster_spec(FLAT_TUTORIAL)
    assert legacy == flat
    assert legacy.vm_size == "Standard_NC6"  # STANDARD_NC6 canonicalised
    assert (legacy.node_count, legacy.processes_per_node, legacy.gpus_per_node) == (2, 1, 1)
    assert legacy.mounts == (BlobMount("landcoverdata", "chips", "bfs"),)
    assert legacy.setup_command == "pip install landcover"
    assert legacy.engine == "local" and legacy.elastic is None and legacy.max_restarts == 0
    # the key is remembered only to be scrubbed, and never shown
    assert legacy.secret_values == {ACCOUNT_KEY}
    assert ACCOUNT_KEY not in repr(legacy)


def test_legacy_autoscale_is_an_elastic_job_of_maximum_nodes() -> None:
    legacy = parse_cluster_spec(
        {
            "properties": {
                "vmSize": "Standard_NC24s_v3",
                "vmPriority": "lowpriority",
                "scaleSettings": {
                    "autoScale": {
                        "minimumNodeCount": 0,
                        "maximumNodeCount": 4,
                        "initialNodeCount": 0,
                    }
                },
            },
            "elastic": {"maxRestarts": 5},
        }
    )
    flat = parse_cluster_spec(
        {
            "vmSize": "standard_nc24s_v3",
            "vmPriority": "lowPriority",
            "targetNodeCount": 4,
            "elastic": {"minNodes": 1, "maxNodes": 4, "maxRestarts": 5},
        }
    )
    assert legacy == flat
    assert legacy.elastic == ElasticSpec(min_nodes=1, max_nodes=4, max_restarts=5)
    assert legacy.processes_per_node == 4  # "auto": the 4 V100s of the size
    assert legacy.vm_priority == "lowpriority"


def test_repo_cluster_json_is_a_working_local_example() -> None:
    spec = load_cluster_spec(REPO_CLUSTER_JSON)
    assert spec.engine == "local"
    assert spec.node_count == 2 and spec.processes_per_node == 1
    assert spec.max_restarts >= 1


def test_auto_processes_on_this_machine_and_defaults() -> None:
    spec = parse_cluster_spec({"targetNodeCount": 3})
    assert spec.name == "landcover" and spec.vm_size == "local"
    assert spec.processes_per_node == max(1, local_gpu_count())
    assert spec.vcpus_per_node == local_cpu_count()
    assert spec.data.mode == "mount" and spec.data.url is None
    elastic = parse_cluster_spec({"targetNodeCount": 3, "elastic": {}})
    assert elastic.elastic == ElasticSpec(3, 3, 3)  # restarts only, at a fixed size
    cpu = parse_cluster_spec({"targetNodeCount": 2, "vmSize": "Standard_D4s_v3"})
    assert cpu.processes_per_node == 1 and cpu.gpus_per_node == 0


def test_local_spec_for_sweeps() -> None:
    spec = local_spec(4)
    assert (spec.node_count, spec.processes_per_node, spec.workers) == (1, 4, 4)
    with pytest.raises(ClusterSpecError, match="workers must be >= 1"):
        local_spec(0)


AZUREML = {"subscriptionId": "s", "resourceGroup": "g", "workspace": "w", "image": "i"}

BAD_SPECS: list[tuple[Any, str]] = [
    ({"vmSize": "local"}, 'targetNodeCount is missing: set "targetNodeCount": N'),
    ({"targetNodeCount": 0}, "targetNodeCount must be >= 1, got 0"),
    ({"targetNodeCount": -2}, "targetNodeCount must be >= 1, got -2"),
    ({"targetNodeCount": "two"}, "targetNodeCount must be a whole number, got 'two'"),
    ({"targetNodeCount": True}, "targetNodeCount must be a whole number, got True"),
    (
        {"targetNodeCount": 2, "engine": "pbs"},
        "engine must be 'local', 'azureml', 'kubernetes', 'slurm' or 'dask', got 'pbs'",
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"timeLimit": "2h"}},
        'slurm.timeLimit: must be "HH:MM:SS" or "D-HH:MM:SS", e.g. "02:00:00" (got \'2h\')',
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"timeLimit": "01:75:00"}},
        'slurm.timeLimit: must be "HH:MM:SS"',
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"gpusPerNode": -1}},
        "slurm.gpusPerNode must be >= 0, got -1",
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"cpusPerTask": 0}},
        "slurm.cpusPerTask must be >= 1, got 0",
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"partition": "gpu nodes"}},
        "slurm.partition: must be a SLURM partition name (got 'gpu nodes')",
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"setup": ["ok", "a\nb"]}},
        "slurm.setup[1]: must be one non-empty line (got 'a\\nb')",
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"extraDirectives": ["exclusive"]}},
        'slurm.extraDirectives[0]: must be an sbatch option such as "--exclusive"',
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"socketInterface": "eth 0"}},
        'slurm.socketInterface: must be a network interface name such as "eth0"',
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "slurm": {"timelimit": "01:00:00"}},
        "unknown field 'slurm.timelimit': did you mean 'timeLimit'?",
    ),
    (
        {
            "targetNodeCount": 2,
            "engine": "slurm",
            "slurm": {"gpusPerNode": 2},
            "processesPerNode": 4,
        },
        "processesPerNode 4 exceeds the 2 GPU(s) of slurm.gpusPerNode",
    ),
    (
        {"targetNodeCount": 2, "engine": "slurm", "elastic": {"maxRestarts": 2}},
        'engine "slurm" has no elastic restarts: drop "elastic"',
    ),
    (
        {
            "targetNodeCount": 2,
            "vmSize": "Standard_NC6s_v9",
            "engine": "azureml",
            "azureml": AZUREML,
        },
        "vmSize 'Standard_NC6s_v9' is not in the VM size table (did you mean 'Standard_NC6s_v3'?),"
        ' so processesPerNode "auto" cannot know its GPUs',
    ),
    (
        {"targetNodeCount": 2, "elastic": {"minNodes": 4, "maxNodes": 2}},
        "elastic.minNodes (4) is greater than elastic.maxNodes (2)",
    ),
    (
        {"targetNodeCount": 5, "elastic": {"minNodes": 1, "maxNodes": 4}},
        "targetNodeCount (5) is outside elastic.minNodes..maxNodes (1..4)",
    ),
    (
        {"targetNodeCount": 2, "elastic": {"maxRestarts": -1}},
        "elastic.maxRestarts must be >= 0, got -1",
    ),
    (
        {"targetNodeCount": 2, "targetNodeCont": 3},
        "unknown field 'targetNodeCont': did you mean 'targetNodeCount'?",
    ),
    (
        {"targetNodeCount": 2, "processesPerNode": 0},
        'processesPerNode must be "auto" or a whole number >= 1, got 0',
    ),
    (
        {"targetNodeCount": 2, "vmSize": "Standard_NC24s_v3", "processesPerNode": 8},
        "processesPerNode 8 exceeds the 4 GPU(s) of Standard_NC24s_v3",
    ),
    (
        {"targetNodeCount": 2, "engine": "azureml", "vmSize": "Standard_NC6"},
        'engine "azureml" needs an "azureml" section',
    ),
    (
        {
            "targetNodeCount": 2,
            "engine": "azureml",
            "vmSize": "Standard_NC6",
            "azureml": {"subscriptionId": "s", "workspace": "w", "image": "i"},
        },
        "azureml.resourceGroup is missing: give the resource group",
    ),
    (
        {"targetNodeCount": 2, "engine": "kubernetes", "kubernetes": {"image": "x"}},
        'vmSize "local" names this machine; engine "kubernetes" needs an Azure VM size',
    ),
    ({"targetNodeCount": 2, "data": {"mode": "copy"}}, "data.mode must be 'mount' or 'direct'"),
    ({"targetNodeCount": 2, "name": "my cluster"}, "name 'my cluster' must be 2-40 letters"),
    (
        {"targetNodeCount": 2, "vmPriority": "spot"},
        "vmPriority must be 'dedicated' or 'lowpriority', got 'spot'",
    ),
    (
        {"properties": {"vmSize": "STANDARD_NC6", "scaleSettings": {}}},
        "properties.scaleSettings needs exactly one of",
    ),
    (
        {"properties": {"vmSize": "STANDARD_NC6", "scaleSettings": {"manual": {}}}},
        "properties.scaleSettings.manual.targetNodeCount is missing",
    ),
    (
        {
            "properties": {
                "vmSize": "STANDARD_NC6",
                "scaleSettings": {"autoScale": {"minimumNodeCount": 5, "maximumNodeCount": 2}},
            }
        },
        "autoScale.minimumNodeCount (5) is greater than maximumNodeCount (2)",
    ),
    (
        {"properties": {"scaleSettings": {"manual": {"targetNodeCount": 1}}}},
        'properties.vmSize is missing: set "vmSize"',
    ),
    (
        {"targetNodeCount": 2, "properties": {"vmSize": "x"}},
        "unknown field 'targetNodeCount': in the legacy form it goes inside \"properties\"",
    ),
    ([1, 2], "the top level must be a JSON object"),
]


@pytest.mark.parametrize(("document", "message"), BAD_SPECS)
def test_bad_spec_is_one_clear_line(document: Any, message: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_spec(document, source="c.json")
    text = str(info.value)
    assert text.startswith("c.json: ")
    assert message in text
    assert "\n" not in text


def test_files_that_do_not_parse(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"targetNodeCount": 2,}')
    not_json = r"broken.json: not valid JSON \(.* at line 1 column 23\); fix the syntax"
    with pytest.raises(ClusterSpecError, match=not_json):
        load_cluster_spec(broken)
    with pytest.raises(ClusterSpecError, match=r"missing.json: no such file"):
        load_cluster_spec(tmp_path / "missing.json")


def test_an_error_never_echoes_a_secret() -> None:
    document = json.loads(json.dumps(LEGACY_TUTORIAL))
    document["name"] = "x" * 50 + ACCOUNT_KEY  # a key pasted into the wrong field
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_spec(document)
    assert "must be 2-40 letters" in str(info.value)
    assert ACCOUNT_KEY not in str(info.value) and "<redacted>" in str(info.value)


def test_slurm_section_and_its_defaults() -> None:
    spec = parse_cluster_spec(
        {
            "engine": "slurm",
            "targetNodeCount": 2,
            "slurm": {
                "partition": "gpu",
                "account": "proj-42",
                "timeLimit": "1-02:00:00",
                "gpusPerNode": 4,
                "cpusPerTask": 8,
                "setup": ["module load cuda", "source venv/bin/activate"],
                "extraDirectives": ["--exclusive", "#SBATCH --mem=0"],
                "socketInterface": "ib0",
            },
        }
    )
    assert (spec.node_count, spec.gpus_per_node, spec.processes_per_node) == (2, 4, 4)
    assert spec.section == SlurmSpec(
        partition="gpu",
        account="proj-42",
        time_limit="1-02:00:00",
        cpus_per_task=8,
        setup=("module load cuda", "source venv/bin/activate"),
        extra_directives=("--exclusive", "#SBATCH --mem=0"),
        socket_interface="ib0",
    )
    # only engine and targetNodeCount are needed: CPU nodes, one task each, SLURM's defaults
    bare = parse_cluster_spec({"engine": "slurm", "targetNodeCount": 3})
    assert (bare.gpus_per_node, bare.processes_per_node, bare.vcpus_per_node) == (0, 1, None)
    assert bare.section == SlurmSpec()
    # a known VM size gives its GPUs and vCPUs, as on the other engines
    sized = parse_cluster_spec(
        {"engine": "slurm", "targetNodeCount": 2, "vmSize": "Standard_NC24s_v3"}
    )
    assert (sized.gpus_per_node, sized.processes_per_node, sized.vcpus_per_node) == (4, 4, 24)
