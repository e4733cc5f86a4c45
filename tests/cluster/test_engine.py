"""Jobs, their input and output references, resource shares, and plan files."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.azureml.section import AzureMLSpec
from cluster.clusterjson import parse_cluster_spec
from cluster.engine import (
    Job,
    LaunchOptions,
    PlanEngine,
    get_engine,
    input_ref,
    output_ref,
    plan_job,
    threads_per_worker,
    write_plan_files,
)
from cluster.engines import ENGINES
from cluster.errors import ClusterError
from cluster.kubernetes.section import KubernetesSpec
from cluster.spec import local_spec
from tests.cluster.fake_worker import fake_job
from tiling.runtime.machine import local_cpu_count


def test_references_are_bound_to_the_job_inputs_and_outputs() -> None:
    job = Job(
        "m",
        (input_ref("store"), f"--out={output_ref('run')}", "--x", "${{inputs}}"),
        inputs={"store": "az://c/chips.zarr"},
        outputs={"run": "runs/a"},
    )
    assert job.bound_argv() == ["az://c/chips.zarr", "--out=runs/a", "--x", "${{inputs}}"]
    assert job.output_dir == "runs/a" and Job("m").output_dir is None
    with pytest.raises(ClusterError, match=r"job argument '\$\{\{outputs.logs\}\}' names no "):
        Job("m", (output_ref("logs"),), outputs={"run": "r"})


def test_threads_are_a_fair_share_of_each_workers_cores() -> None:
    spec = parse_cluster_spec({"targetNodeCount": 2, "elastic": {"maxRestarts": 2}})
    assert threads_per_worker(spec) == max(1, local_cpu_count() // 2)
    # remote engines: a fair share of the VM's vCPUs
    nc24 = parse_cluster_spec(
        {"targetNodeCount": 2, "vmSize": "Standard_NC24s_v3", "engine": "kubernetes",
         "kubernetes": {"image": "i"}}
    )  # fmt: skip
    assert threads_per_worker(nc24) == 24 // 4


def test_plan_files_are_not_overwritten_silently(tmp_path: Path) -> None:
    spec = parse_cluster_spec({"targetNodeCount": 1})
    plan = plan_job(spec, fake_job("s", str(tmp_path / "run")))
    written = write_plan_files(plan, tmp_path / "plan")
    assert sorted(p.name for p in written) == ["plan.txt", "torchrun.sh"]
    with pytest.raises(ClusterError, match="exists; pass --overwrite"):
        write_plan_files(plan, tmp_path / "plan")
    write_plan_files(plan, tmp_path / "plan", overwrite=True)
    assert not list((tmp_path / "plan").glob(".*tmp*"))


def test_cluster_imports_neither_landcover_nor_torch_nor_the_azure_sdk() -> None:
    code = (
        "import sys\n"
        "import cluster.spec, cluster.engine, cluster.local.engine\n"
        "import cluster.azureml.engine, cluster.kubernetes.engine, cluster.redact\n"
        "print(sorted(m for m in ('torch', 'landcover', 'azure.ai.ml', 'azure.identity')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- arguments and paths reach the worker as given, on every engine ---------------------------

# what a user may put in an argument or a path, and each engine's shell, sbatch or kubelet
# would otherwise read: spaces, quotes, $ (shell and Kubernetes' $(VAR)), # (sbatch comments),
# % (SLURM's file patterns)
AWKWARD_ARGS = (
    "--note", "two words", "it's", 'say "hi"', "$HOME", "$(OMP_NUM_THREADS)", "$$", "50%",
    "#hash", "a\\b", "",
)  # fmt: skip
AWKWARD_DIR = "runs/a b 'q' \"d\" $x 50% #1"
MOUNTED = "/mnt/azureml/cr/j/1/cap/data-capability/wd/INPUT_store"  # what Azure ML binds


def _argv_as_run(
    command: list[str], tmp_path: Path, program: str, env: dict[str, str] | None = None
) -> list[str]:
    """The argv `program` gets when `command` runs (`sh -c LINE`, a container's command):
    `program` is a stand-in on PATH that writes its arguments NUL-separated."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / program
    stand_in.write_text('#!/bin/sh\nprintf "%s\\0" "$@"\n')
    stand_in.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": "/home/u", **(env or {})}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return done.stdout.split("\0")[:-1]


def _kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet passes for a container's command or args (apimachinery's expansion):
    `$(NAME)` of a defined variable → its value, `$$` → `$`, anything else as it is."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            close = text.find(")", i + 2) if nxt == "(" else -1
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if close >= 0:
                name = text[i + 2 : close]
                out.append(env.get(name, f"$({name})"))
                i = close + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _sbatch_words(line: str) -> list[str]:
    """The words sbatch reads from an #SBATCH line (`_get_argument` of src/sbatch/opt.c): `\\`
    escapes the next character, a quote groups until its match, an unquoted `#` ends it."""
    words: list[str] = []
    word: list[str] | None = None
    quote, escape = "", False
    for char in line:
        if escape:
            escape = False
        elif char == "\\":
            escape = True
            word = word if word is not None else []
            continue
        elif quote:
            if char == quote:
                quote = ""
                continue
        elif char in "\"'":
            quote, word = char, word if word is not None else []
            continue
        elif char == "#":
            break
        elif char.isspace():
            if word is not None:
                words.append("".join(word))
            word = None
            continue
        word = word if word is not None else []
        word.append(char)
    assert not quote, f"sbatch: unmatched {quote} in {line!r}"
    if word is not None:
        words.append("".join(word))
    return words


ENGINE_DOCUMENTS: dict[str, dict[str, object]] = {
    "slurm": {"engine": "slurm", "targetNodeCount": 2},
    "azureml": {
        "engine": "azureml", "vmSize": "Standard_NC6s_v3", "targetNodeCount": 2,
        "azureml": {"subscriptionId": "s", "resourceGroup": "g", "workspace": "w", "image": "i"},
        "data": {"accountName": "acct"},
    },
    "kubernetes trainjob": {
        "engine": "kubernetes", "vmSize": "Standard_NC6s_v3", "targetNodeCount": 2,
        "kubernetes": {"image": "i"},
    },
    "kubernetes pytorchjob": {
        "engine": "kubernetes", "vmSize": "Standard_NC6s_v3", "targetNodeCount": 2,
        "kubernetes": {"image": "i", "api": "pytorchjob"},
    },
}  # fmt: skip


@pytest.mark.parametrize("engine", list(ENGINE_DOCUMENTS))
def test_arguments_and_paths_reach_the_worker_as_given(engine: str, tmp_path: Path) -> None:
    run_dir = str(tmp_path / AWKWARD_DIR)
    job = fake_job("az://chips/naip.zarr", run_dir, f"{input_ref('store')}/sub dir", *AWKWARD_ARGS)
    plan = plan_job(parse_cluster_spec(ENGINE_DOCUMENTS[engine]), job)
    expected = [*job.bound_argv()]
    if engine == "slurm":
        script = plan.files()["slurm.sbatch"]
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        logs = f"{run_dir}/logs".replace("%", "%%")
        options = [_sbatch_words(line.removeprefix("#SBATCH")) for line in script.splitlines()]
        assert [f"--output={logs}/slurm-%j.out"] in options
        srun = script.splitlines()[-1].removeprefix("exec ")
        argv = _argv_as_run(["sh", "-c", srun], tmp_path, "srun")
        assert argv[:2] == ["--kill-on-bad-exit=1", f"--output={logs}/job-%j-rank-%t.log"]
        assert argv[2:] == ["python", "-m", job.entry_module, *expected]
    elif engine == "azureml":
        command = plan.job_document["command"]  # type: ignore[attr-defined]
        bound = command.replace(input_ref("store"), MOUNTED).replace(output_ref("run"), "/o")
        argv = _argv_as_run(["sh", "-c", bound], tmp_path, "python")
        azure = [a.replace(input_ref("store"), MOUNTED) for a in job.argv]
        assert argv == [
            "-m",
            job.entry_module,
            *(a.replace(output_ref("run"), "/o") for a in azure),
        ]
    else:
        manifest = plan.manifest  # type: ignore[attr-defined]
        if manifest["kind"] == "TrainJob":
            container = manifest["spec"]["trainer"]
            command = [*container["command"], *container["args"]]
        else:
            container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
                "containers"
            ][0]
            command = container["command"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        command = [_kubelet_expand(word, env) for word in command]
        operator = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "MASTER_ADDR": "m", "MASTER_PORT": "1"}
        argv = _argv_as_run(command, tmp_path, "python", {**env, **operator})
        assert argv[-len(expected) :] == expected


def test_an_azure_ml_argument_with_a_binding_it_does_not_have_is_refused() -> None:
    spec = parse_cluster_spec(ENGINE_DOCUMENTS["azureml"])
    with pytest.raises(ClusterError, match=r"holds '\$\{\{', which Azure ML reads as an input"):
        plan_job(spec, fake_job("az://c/s.zarr", "r", "--note", "${{ not a binding }}"))


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_an_engine_launches_only_its_own_kind_of_plan(name: str) -> None:
    """Every engine is a `PlanEngine`: another engine's plan is a programming error."""

    class OtherPlan:
        engine = "other"

    engine = get_engine(name)
    assert isinstance(engine, PlanEngine)
    with pytest.raises(TypeError, match="cannot launch a other plan"):
        engine.launch(OtherPlan(), LaunchOptions())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "kind", "message"),
    [
        ("azureml", AzureMLSpec, 'engine "azureml" needs an "azureml" section in cluster.json'),
        ("kubernetes", KubernetesSpec, 'engine "kubernetes" needs a "kubernetes" section'),
    ],
)
def test_an_engine_that_needs_its_section_names_it_when_the_spec_has_none(
    engine: str, kind: type[object], message: str
) -> None:
    spec = dataclasses.replace(local_spec(1), engine=engine, section=None)
    with pytest.raises(ClusterError, match=message):
        spec.required_section(kind)
    with pytest.raises(ClusterError, match=message):
        get_engine(engine).plan(spec, fake_job("s", "run"))
