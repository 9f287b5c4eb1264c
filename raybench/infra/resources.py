"""GPU shares of encoder actors and SAE trials: `auto` resolved against the connected Ray cluster.

`encoders.num_gpus` and `resources.trial_gpus` default to `auto` (numbers are used as given). When the
cluster has GPUs (`ray.cluster_resources()["GPU"]`, or GPU node types its autoscaler may start from zero: see
`autoscaler_potential`), a worker asks for 1/n of a GPU, n the most copies of its memory need that fit in the
usable part of one GPU, capped at `resources.max_per_gpu`; without GPUs it asks for 0 and runs on CPU. The needs
are estimates in float32 bytes (below); the GPU's memory comes from `resources.gpu_memory_gb`, else from the cluster's
`accelerator_type:<name>` resource when listed in `GPU_MEMORY_GIB`, else `ASSUMED_GPU_GIB`. What was chosen
is written to the run folder (`resources_resolved.json` beside run.yaml, RunLayout.resources_resolved) and
logged. A worker that gets a GPU share but finds no CUDA device (a logical GPU) still runs on CPU.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raybench.core.atomic import read_json, write_json
from raybench.core.config import GpuShare, ResourceConfig, ReuseMode
from raybench.core.paths import RunLayout

if TYPE_CHECKING:
    from raybench.core.config import EncoderConfig

log = logging.getLogger(__name__)

GIB = 1 << 30
FLOAT_BYTES = 4
ASSUMED_GPU_GIB = 16.0
"""GPU memory assumed when neither the config nor the cluster's accelerator type gives it (a T4 / V100)."""
USABLE = 0.8
"""Part of a GPU's memory shares are sized against (CUDA context, allocator slack, fragmentation)."""
GPU_MEMORY_GIB = {
    "T4": 16, "V100": 16, "P100": 16, "A10G": 24, "L4": 24, "L40S": 48, "A100": 40, "A100-40G": 40,
    "A100-80G": 80, "H100": 80, "H200": 141, "B200": 180,
}
"""Memory of Ray's accelerator types (`accelerator_type:<name>`), the smallest model of each name."""
SAE_STATE_COPIES = 4
"""Per SAE parameter: the value, its gradient and Adam's two moments."""
SAE_BATCH_COPIES = 3
"""Per latent and batch row: pre-activations, the top-k code and the AuxK pre-activations."""
ENCODER_WORK = 32
"""An encoder's working memory per input value of a batch (token states, attention, MLP of one layer)."""


@dataclass(frozen=True)
class GpuInventory:
    """What the cluster offers: GPU count and the memory of its smallest GPU, with where that figure came from."""

    count: float
    memory_bytes: int
    memory_source: str


@dataclass(frozen=True)
class Choice:
    """One resolved share: what was asked, what a worker gets, and the estimate behind it."""

    requested: GpuShare
    gpus: float
    need_gib: float
    gpu_memory_gib: float
    memory_source: str
    cluster_gpus: float
    per_gpu: int


# ---------------------------------------------------------------- pure

def sae_trial_bytes(d: int, n_latents: int, n_saes: int, batch_size: int, n_train: int = 0) -> int:
    """A stack of `n_saes` BatchTopK SAEs (d -> n_latents) training on batches of `batch_size`: parameters with
    gradients and Adam moments, the batch's latent-sized tensors, and the `n_train` x d training set on device."""
    params = n_saes * (2 * d * n_latents + n_latents + d)
    batch = n_saes * batch_size * (SAE_BATCH_COPIES * n_latents + 4 * d)
    return FLOAT_BYTES * (SAE_STATE_COPIES * params + batch + n_train * d)


def encoder_bytes(n_params: int, batch_size: int, input_numel: int, n_layers: int, d: int) -> int:
    """A frozen encoder in inference: its weights, the batch's inputs with their working memory, and the pooled
    states of every layer."""
    return FLOAT_BYTES * (n_params + batch_size * (input_numel * (1 + ENCODER_WORK) + n_layers * d))


def per_gpu(need_bytes: int, gpu_bytes: int, max_per_gpu: int, usable: float = USABLE) -> int:
    """How many workers of `need_bytes` share one GPU: as many as fit in usable memory, 1..max_per_gpu (a worker
    that does not fit still gets a whole GPU, and fails there loudly if it really cannot run)."""
    fit = int(usable * gpu_bytes // max(int(need_bytes), 1))
    return max(1, min(int(max_per_gpu), fit))


def share(n: int) -> float:
    """1/n of a GPU, rounded down to Ray's resource precision (1e-4) so n shares never exceed one GPU."""
    return math.floor(1e4 / n) / 1e4


def inventory(cluster: Mapping[str, float], memory_gb: float | None = None) -> GpuInventory:
    """The GPUs of `cluster` (ray.cluster_resources()): count, and the memory of the smallest accelerator type
    listed (or `memory_gb` when given; `ASSUMED_GPU_GIB` when nothing says)."""
    count = float(cluster.get("GPU", 0.0))
    if memory_gb is not None:
        return GpuInventory(count, int(memory_gb * GIB), "resources.gpu_memory_gb")
    known = sorted((GPU_MEMORY_GIB[k.split(":", 1)[1]], k) for k in cluster
                   if k.startswith("accelerator_type:") and k.split(":", 1)[1] in GPU_MEMORY_GIB)
    if known:
        return GpuInventory(count, int(known[0][0] * GIB), known[0][1])
    return GpuInventory(count, int(ASSUMED_GPU_GIB * GIB), "assumed")


def resolve(requested: GpuShare, inv: GpuInventory, need_bytes: int, max_per_gpu: int) -> Choice:
    """A number is used as given; auto: 0 without GPUs, else 1/per_gpu(need) of one GPU."""
    n = per_gpu(need_bytes, inv.memory_bytes, max_per_gpu)
    gpus = float(requested) if requested != "auto" else (share(n) if inv.count > 0 else 0.0)
    return Choice(requested, gpus, round(need_bytes / GIB, 3), round(inv.memory_bytes / GIB, 3), inv.memory_source,
                  inv.count, n)


def largest_stack_bytes(stacks: Iterable[tuple[int, int, int]], batch_size: int,
                        n_train: Mapping[int, int] | None = None) -> int:
    """The largest need over stacks given as (d, n_latents, n_saes); `n_train`: d -> training rows, if known."""
    return max((sae_trial_bytes(d, n, s, batch_size, (n_train or {}).get(d, 0)) for d, n, s in stacks), default=0)


# ---------------------------------------------------------------- Ray and the run folder

def with_potential(cluster: Mapping[str, float], potential: Mapping[str, float] | None) -> dict[str, float]:
    """The larger of what the cluster has now and what its autoscaler may add (`potential`: the most of each
    resource its node types can reach), so GPU workers that scale from zero still count."""
    out = {k: float(v) for k, v in cluster.items()}
    for k, v in (potential or {}).items():
        out[k] = max(out.get(k, 0.0), float(v))
    return out


def node_type_potential(config: Mapping[str, Any]) -> dict[str, float]:
    """The most of each resource an autoscaling config's node types reach: each worker type's `resources` times
    its max_workers (capped by the config's max_workers), plus the head type's once."""
    cap = config.get("max_workers")
    out: dict[str, float] = {}
    for name, node_type in (config.get("available_node_types") or {}).items():
        count = int(node_type.get("max_workers", cap or 0))
        if name == config.get("head_node_type"):
            count = 1
        elif cap is not None:
            count = min(count, int(cap))
        for key, value in (node_type.get("resources") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = out.get(key, 0.0) + float(value) * count
    return out


def ray_monitor_scripts() -> list[Path]:
    """The installed Ray's autoscaler monitors (ray/autoscaler/_private/monitor.py, and v2's), the scripts `ray
    start` runs them as (ray._private.services.start_monitor)."""
    import importlib.util

    found = []
    for module in ("ray.autoscaler._private.monitor", "ray.autoscaler.v2.monitor"):
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:
            spec = None
        if spec is not None and spec.origin:
            found.append(Path(spec.origin))
    return found


def _runs_script(proc: Any, args: list[str], scripts: list[Path]) -> bool:
    """Whether `proc` is a Python process of this user running one of `scripts` itself: the first argument after the
    interpreter and its options is that file (not `-c`/`-m` code that merely names it), and the process is ours
    (another user's process could name any config)."""
    try:
        if proc.uids().real != os.getuid():
            return False
    except Exception:
        return False
    rest = args[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-c", "-m"):
        rest = rest[1:]
    if not rest or rest[0].startswith("-"):
        return False
    path = Path(proc.info.get("cwd") or "/") / rest[0]
    for script in scripts:
        try:
            if path.samefile(script):
                return True
        except OSError:
            continue
    return False


def monitor_config_path(gcs_address: str, script: str | Path | None = None) -> Path | None:
    """The autoscaling config that the autoscaler (Ray's `monitor.py` process) of the cluster at `gcs_address`
    was started with, when it runs on this machine: the head of `ray up` (~/ray_bootstrap_config.yaml, resources
    filled in) or of `ray start --autoscaling-config=...` (cluster/local.yaml), where the driver runs. Only a
    process of this user that runs Ray's own monitor script (`script`, default the installed one) counts: any
    process can call itself monitor.py and name a config that claims GPUs the cluster lacks."""
    try:
        import psutil  # shipped inside ray (ray/thirdparty_files) when not installed
    except ImportError:
        return None
    scripts = [Path(script)] if script is not None else ray_monitor_scripts()
    if not scripts:
        return None
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        args = proc.info.get("cmdline") or []
        if not any(a.endswith("monitor.py") for a in args[:4]) or not _runs_script(proc, args, scripts):
            continue
        opts = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
        if opts.get("--gcs-address") == gcs_address and opts.get("--autoscaling-config"):
            # `ray start --autoscaling-config=cluster/local.yaml` passes the path as typed: relative to its cwd
            return Path(proc.info.get("cwd") or "/") / Path(opts["--autoscaling-config"]).expanduser()
    return None


def read_autoscaling_config(gcs_address: str, script: str | None = None) -> dict[str, Any] | None:
    """The config of `monitor_config_path(gcs_address)`, parsed; None when no such monitor runs on this machine, or
    its file is unreadable or no YAML mapping (logged: the GPU count then falls back to what runs now)."""
    import yaml  # a dependency of ray

    path = monitor_config_path(gcs_address, script)
    if path is None:
        return None
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        log.warning("[resources] the autoscaler's config %s is unreadable (%s); counting the GPUs running now",
                    path, type(err).__name__)
        return None
    return config if isinstance(config, dict) else None


HEAD_READ_TIMEOUT_S = 60.0
MONITOR_SCRIPT: str | None = None  # the monitor script to trust; None: the installed Ray's (tests: a stand-in)
_HEAD_CONFIGS: dict[tuple[str, str], dict[str, Any] | None] = {}  # (GCS address, head node) -> its config


def head_autoscaling_config() -> dict[str, Any] | None:
    """read_autoscaling_config where the autoscaler runs: here when the driver is on the head node, else in a
    0-CPU task pinned to the head (a submitted job's driver lands on a worker when the head has no CPU for it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gcs = ray.get_runtime_context().gcs_address
    head = next((n["NodeID"] for n in ray.nodes() if n.get("Alive") and "node:__internal_head__" in n["Resources"]),
                None)
    script = MONITOR_SCRIPT  # None: the installed Ray's, found on the node that reads it
    if head is None or head == driver_node_id():
        return read_autoscaling_config(gcs, script)
    if (gcs, head) not in _HEAD_CONFIGS:
        task = ray.remote(num_cpus=0, max_retries=0)(read_autoscaling_config)
        ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote(gcs, script)
        try:
            _HEAD_CONFIGS[(gcs, head)] = ray.get(ref, timeout=HEAD_READ_TIMEOUT_S)
        except Exception:
            ray.cancel(ref, force=True)
            raise
    return _HEAD_CONFIGS[(gcs, head)]


def driver_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def autoscaler_potential() -> dict[str, float] | None:
    """What the connected cluster's autoscaler may add: Ray's record of its node types (the one Ray Data and Train
    read; no open-source autoscaler of Ray 2.60 writes it), else the node types of the config its monitor on the
    head reads (head_autoscaling_config). None when neither is found (a local instance; KubeRay, whose autoscaler
    runs in a container of its own)."""
    try:
        from ray._private.state import state

        potential = state.get_max_resources_from_cluster_config()
        if potential:
            return {k: float(v) for k, v in potential.items()}
        config = head_autoscaling_config()
    except Exception as err:  # never fail a run over an estimate: fall back to what the cluster has now
        log.info("[resources] autoscaler node types unreadable (%s); counting the GPUs running now", err)
        return None
    if config is None:
        return None
    try:
        potential = node_type_potential(config)
    except (AttributeError, TypeError, ValueError) as err:  # a YAML mapping that is no autoscaling config
        log.warning("[resources] the autoscaler's config has no readable node types (%s: %s); counting the GPUs "
                    "running now", type(err).__name__, err)
        return None
    log.info("[resources] autoscaler node types (head's autoscaling config): %g GPU at most", potential.get("GPU", 0))
    return potential


def connected_inventory(res: ResourceConfig) -> GpuInventory:
    """The connected Ray cluster's GPUs, now or reachable by its autoscaler (none when Ray is not initialized)."""
    import ray

    if not ray.is_initialized():
        return inventory({}, res.gpu_memory_gb)
    return inventory(with_potential(ray.cluster_resources(), autoscaler_potential()), res.gpu_memory_gb)


def declared_gpus(requested: GpuShare, res: ResourceConfig) -> float:
    """What a worker would declare before its need is known: a number as given; auto: the smallest
    share auto picks (1/max_per_gpu) when the connected cluster has GPUs, else 0."""
    if requested != "auto":
        return float(requested)
    return share(res.max_per_gpu) if connected_inventory(res).count > 0 else 0.0


def resolve_encoder_gpus(num_gpus: GpuShare, encoder: Any, x_shape: tuple[int, ...], batch_size: int,
                         run_root: str | Path | None, res: ResourceConfig | None = None) -> float:
    """An encoder actor's GPU share for `encoder` (a torch module with n_layers and d) on native inputs of
    `x_shape`; recorded under encode/<name> in the run folder and logged."""
    res = res or ResourceConfig()
    n_params = sum(int(p.numel()) for p in encoder.parameters())
    need = encoder_bytes(n_params, batch_size, math.prod(x_shape), int(encoder.n_layers), int(encoder.d))
    choice = resolve(num_gpus, connected_inventory(res), need, res.max_per_gpu)
    record(run_root, "encode", str(encoder.name), choice, "encoder actor")
    return choice.gpus


def resolve_trial_gpus(trial_gpus: GpuShare, cells: Iterable[Any], batch_size: int, run_root: str | Path | None,
                       res: ResourceConfig, n_train: Mapping[int, int] | None = None) -> float:
    """An SAE trial's GPU share, sized for the largest stack of `cells` (CellSpecs: a trial trains its stacks
    one at a time); recorded under train/trial in the run folder and logged."""
    stacks: dict[str, list[int]] = {}
    for c in cells:
        stacks.setdefault(c.stack_id, [c.d, c.n_latents, 0])[2] += 1
    need = largest_stack_bytes((tuple(v) for v in stacks.values()), batch_size, n_train)
    choice = resolve(trial_gpus, connected_inventory(res), need, res.max_per_gpu)
    record(run_root, "train", "trial", choice, "SAE trial")
    return choice.gpus



def with_encoder_gpus(enc_cfg: EncoderConfig, encoder: Any, x_shape: tuple[int, ...], run_root: str | Path | None,
                      res: ResourceConfig | None = None) -> EncoderConfig:
    """enc_cfg with num_gpus resolved for `encoder` (resolve_encoder_gpus): what the actor pool asks for."""
    gpus = resolve_encoder_gpus(enc_cfg.num_gpus, encoder, x_shape, enc_cfg.batch_size, run_root, res)
    return replace(enc_cfg, num_gpus=gpus)


def record(run_root: str | Path | None, stage: str, key: str, choice: Choice, what: str) -> None:
    """Write `choice` into <run>/resources_resolved.json (stage -> key -> choice) and log it; a share chosen by
    auto also goes to stderr, once per run folder and key."""
    line = (f"[resources] {stage} {key}: {choice.requested} -> {choice.gpus:g} GPU per {what} (need "
            f"{choice.need_gib:.2f} GiB; GPU {choice.gpu_memory_gib:g} GiB from {choice.memory_source}; "
            f"cluster GPUs {choice.cluster_gpus:g})")
    log.info(line)
    if run_root is None:
        return
    path = RunLayout.at(run_root).resources_resolved
    data = read_json(path) if path.exists() else {}
    entry = asdict(choice)
    if data.get(stage, {}).get(key) == entry:
        return
    data.setdefault(stage, {})[key] = entry
    write_json(path, data)
    if choice.requested == "auto" and choice.gpus > 0:
        print(line, file=sys.stderr, flush=True)


def resolve_reuse_trial_processes(mode: ReuseMode) -> bool:
    """resources.reuse_trial_processes as Tune's reuse_actors: auto is on only for a local instance raybench
    started itself (raybench.infra.ray_session.owns_local_instance), where no node can join mid-run."""
    from raybench.infra.ray_session import owns_local_instance

    reuse = owns_local_instance() if mode == "auto" else bool(mode)
    log.info("[resources] train reuse_trial_processes: %s -> %s", mode, reuse)
    return reuse
