"""The scheduler fallback of `difflite generate`: a diffusers scheduler, for a config no NumPy port
in difflite/runtime/schedulers.py reproduces, behind the ports' interface. It imports torch and
diffusers, which the runtime never does: the command layer installs `build` as the runtime's
fallback (schedulers.use_fallback), and tests use `diffusers_scheduler` as the reference."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np

from difflite.core.errors import BadInput
from difflite.runtime import schedulers


def build(name: str, config: dict, timestep_spacing: str | None = None,
          pipeline_fixes: bool = True) -> "DiffusersAdapter":
    """The fallback make_scheduler calls: diffusers' scheduler behind the NumPy interface."""
    return DiffusersAdapter(diffusers_scheduler(name, config, timestep_spacing, pipeline_fixes))


def diffusers_scheduler(name: str, config: dict, timestep_spacing: str | None = None, pipeline_fixes: bool = True):
    """The real diffusers scheduler for the same name and config rules (imports diffusers);
    pipeline_fixes: StableDiffusionPipeline's config fixes (SDXL's pipelines make none)."""
    class_name, merged = schedulers.resolve(name, config, timestep_spacing)
    import diffusers
    from diffusers.utils import logging as diffusers_logging

    cls = getattr(diffusers, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        raise BadInput(f"scheduler_config.json: {class_name!r} is not a diffusers scheduler class "
                       f"(pass --scheduler {'|'.join(schedulers.SCHEDULERS)})")
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # "config attributes ... not expected" chatter
    try:
        scheduler = cls.from_config(merged)
        fixes = schedulers.pipeline_fixes(scheduler.config) if pipeline_fixes else {}
        return cls.from_config({**merged, **fixes}) if fixes else scheduler
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise BadInput(f"scheduler_config.json: cannot build {class_name} ({str(exc).splitlines()[0]})") from exc
    finally:
        diffusers_logging.set_verbosity(verbosity)


class DiffusersAdapter:
    """A diffusers scheduler behind the ports' NumPy interface. Its noise draws (diffusers'
    randn_tensor) come from our generator, in diffusers' order and shape; the few classes that draw
    otherwise (DPMSolverSDEScheduler's Brownian tree, the SDE-VE and cosine DPM schedulers) use
    torch's global generator."""

    def __init__(self, scheduler):
        import torch

        self._torch = torch
        self.scheduler = scheduler
        self.class_name = type(scheduler).__name__
        self.order = scheduler.order

    @property
    def init_noise_sigma(self) -> float:
        return float(self.scheduler.init_noise_sigma)

    @property
    def timesteps(self):
        return None if self.scheduler.timesteps is None else self.scheduler.timesteps.numpy()

    def set_timesteps(self, num_inference_steps: int) -> None:
        self.scheduler.set_timesteps(num_inference_steps)

    def set_begin_index(self, begin_index: int) -> None:
        if hasattr(self.scheduler, "set_begin_index"):
            self.scheduler.set_begin_index(begin_index)

    def _tensor(self, array):
        return self._torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    def _timestep(self, timestep):
        # the pipelines pass an element of scheduler.timesteps: a 0-d tensor of its dtype
        return self._torch.tensor(schedulers.scalar(timestep).item(), dtype=self.scheduler.timesteps.dtype)

    def scale_model_input(self, sample: np.ndarray, timestep) -> np.ndarray:
        return self.scheduler.scale_model_input(self._tensor(sample), self._timestep(timestep)).numpy()

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        with self._noise_from(generator):
            out = self.scheduler.step(self._tensor(model_output), self._timestep(timestep), self._tensor(sample),
                                      return_dict=False)
        return out[0].numpy()

    def add_noise(self, original: np.ndarray, noise: np.ndarray, timestep) -> np.ndarray:
        timesteps = self._timestep(timestep).reshape(1)
        return self.scheduler.add_noise(self._tensor(original), self._tensor(noise), timesteps).numpy()

    @contextmanager
    def _noise_from(self, generator):
        """Route the scheduler module's randn_tensor to `generator` during one step."""
        module = sys.modules[type(self.scheduler).__module__]
        original = getattr(module, "randn_tensor", None)
        if generator is None or original is None:
            yield
            return

        def randn_tensor(shape, *_, dtype=None, **__):
            noise = self._tensor(generator.randn(tuple(shape)))
            return noise if dtype is None else noise.to(dtype=dtype)

        module.randn_tensor = randn_tensor
        try:
            yield
        finally:
            module.randn_tensor = original


