"""One fixed set of CPU kernels for the testbed, so that its figures are the same on any x86-64 CPU.

An RL run's trajectory diverges from a last-bit float difference, and torch picks its CPU kernels by the machine
(AVX-512 on one, AVX2 on another), as do MKL and oneDNN beneath it: the same seed then trains differently on two
machines. The testbed pins them before torch loads:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's own kernels, the AVX2 set nearly every x86-64 CPU since 2013 has;
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility on its SSE2 branch without the approximate
  rcpps/rsqrtps instructions. It is the one branch besides AUTO that MKL honours on non-Intel CPUs: the AVX2 branch
  pinned before is Intel-only, and on an AMD CPU MKL silently falls back to AUTO (measured on this project's AMD
  EPYC: ``MKL_CBWR=AVX2`` gives the same bits as no setting, ``COMPATIBLE`` others), so an Intel and an AMD machine
  ran different matrix products (docs/testbed.md, "Reproducibility");
- ``DNNL_MAX_CPU_ISA=AVX2``: oneDNN (no testbed op uses it today; pinned so that one added later is covered).

Each library reads its setting from the environment when it loads, and importing ``recipe_apo`` loads torch
(through verl): so ``recipe_apo/__init__.py`` sets them first when the process was started as
``python -m recipe_apo.testbed`` (``pin_early``), and the testbed re-executes itself once with them where that could
not happen (torch loaded before, an interpreter started another way). Its worker processes inherit them.
``RECIPE_APO_TESTBED_KERNELS=native`` lets the libraries choose, as before. Threads are the testbed's own setting
(``threads_per_worker``), recorded beside the kernels in ``summary.json``.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping, Optional

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "DNNL_MAX_CPU_ISA": "AVX2"}
SWITCH = "RECIPE_APO_TESTBED_KERNELS"


def wanted(env: Mapping[str, str]) -> bool:
    """Whether this process should run on the pinned kernels (x86-64 only: the names are x86's)."""
    return env.get(SWITCH, "pinned") != "native" and platform.machine().lower() in ("x86_64", "amd64")


def pinned_env(env: Mapping[str, str]) -> Optional[dict[str, str]]:
    """``env`` with the pinned kernel settings, or None when it has them already (or pinning is off)."""
    if not wanted(env) or all(env.get(key) == value for key, value in PINNED.items()):
        return None
    return {**env, **PINNED}


def started_as(module: str, argv: list[str]) -> bool:
    """Whether ``argv`` (``sys.orig_argv``) is ``python [options] -m module [arguments]``."""
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "-m":
            return next(rest, None) == module
        if arg.startswith("-m"):
            return arg[2:] == module
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            next(rest, None)  # the option's value
        elif arg == "-c" or not arg.startswith("-"):
            return False  # a command or a script: no module
    return False


def pin_early(module: str = "recipe_apo.testbed") -> None:
    """Put the pinned settings into this process's environment when it was started as ``python -m module`` and
    torch has not loaded yet: the libraries then read them at load, and no second start is needed."""
    if "torch" not in sys.modules and wanted(os.environ) and started_as(module, sys.orig_argv):
        os.environ.update(PINNED)


def reexec_pinned(module: str = "recipe_apo.testbed") -> None:
    """Run ``python -m module`` again, same arguments, on the pinned kernels, unless this process already is."""
    env = pinned_env(os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; else ``platform.processor()``): the pin gives the same bits run
    after run on one machine, and other bits on an Intel Xeon than on an AMD EPYC (docs/testbed.md,
    "Reproducibility"), so a report names the CPU its figures came from."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fingerprint() -> dict[str, str]:
    """The bits of the testbed's own operations on fixed inputs, one short hash per operation, on one thread as the
    testbed's workers run: the GRU policy's forward and backward, its head's matmul and log-softmax, the sampling
    (softmax, then ``torch.multinomial`` with a seeded generator), an AdamW step, and exp/log. Two machines whose
    hashes agree run these operations bit for bit alike; where a run's figures differ between two machines, the
    first differing hash names an operation that differs (docs/testbed.md, "Reproducibility")."""
    import hashlib

    import torch

    def digest(*tensors: torch.Tensor) -> str:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.detach().contiguous().numpy().tobytes())
        return h.hexdigest()[:12]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(8, 12, 32, generator=gen)
        rnn = torch.nn.GRU(32, 64, batch_first=True)
        head = torch.nn.Linear(64, 17)
        with torch.no_grad():
            for p in [*rnn.parameters(), *head.parameters()]:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        hidden, _ = rnn(x)
        logits = head(hidden)
        log_probs = torch.log_softmax(logits, dim=-1)
        loss = -(log_probs[..., 0] * torch.linspace(-1, 1, 12)).mean()
        loss.backward()
        out = {
            "gru_forward": digest(hidden),
            "linear_log_softmax": digest(logits, log_probs),
            "gru_backward": digest(*(p.grad for p in rnn.parameters())),
            "matmul": digest(torch.randn(64, 128, generator=gen) @ torch.randn(128, 96, generator=gen)),
        }
        probs = torch.softmax(logits.detach().reshape(-1, 17), dim=-1)
        out["sampling"] = digest(probs, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(1)))
        # AdamW's update as its single-tensor path (torch's default on CPU) computes it; the optimizer itself is not
        # built: its first step imports torch._dynamo, seconds the report's process would spend for nothing.
        weight, grad = head.weight.detach().clone(), torch.randn(17, 64, generator=gen)
        m, v = torch.zeros_like(weight), torch.zeros_like(weight)
        weight.mul_(1 - 1e-3 * 0.01)
        m.lerp_(grad, 0.1)
        v.mul_(0.999).addcmul_(grad, grad, value=0.001)
        weight.addcdiv_(m, (v.sqrt() / (1 - 0.999) ** 0.5).add_(1e-8), value=-1e-3 / (1 - 0.9))
        out["adamw"] = digest(weight)
        z = torch.linspace(-20, 20, 4001)
        out["exp_log"] = digest(torch.exp(z), torch.log1p(torch.exp(z)), torch.log(torch.abs(z) + 1e-3))
        return out
    finally:
        torch.set_num_threads(threads)


def describe() -> dict[str, object]:
    """What ran: torch's version and kernel set, the pinned settings in force, the threads of this process, the
    CPU, and the kernels' ``fingerprint``."""
    import torch

    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "pinned": {key: os.environ.get(key) for key in PINNED} if wanted(os.environ) else None,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "fingerprint": fingerprint(),
    }
