"""difflite.runtime.schedulers: its NumPy ports run the same denoising loops as diffusers' schedulers
(torch) to within rtol/atol 1e-5, draw their noise as diffusers does, and fall back to the real
diffusers scheduler for configs they do not cover."""

from __future__ import annotations

import inspect
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from difflite import diffusers_schedulers
from difflite.core.errors import BadInput
from difflite.runtime import schedulers
from difflite.runtime.noise import TorchGenerator

from support import ROOT

SD15 = {"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
        "clip_sample": False, "num_train_timesteps": 1000, "set_alpha_to_one": False, "skip_prk_steps": True,
        "steps_offset": 1, "trained_betas": None}
SHAPE = (1, 4, 8, 8)
IMAGE_LATENTS = np.sin(np.arange(np.prod(SHAPE), dtype=np.float32) * np.float32(0.37)).reshape(SHAPE)
SPACINGS = ("leading", "trailing", "linspace")
STEPS = (1, 2, 4, 20)


@pytest.fixture(autouse=True)
def diffusers_fallback(monkeypatch):
    """The runtime as the difflite command wires it: diffusers builds what no port reproduces."""
    monkeypatch.setattr(schedulers, "_fallback", diffusers_schedulers.build)


def test_without_the_fallback_an_unported_config_is_bad_input(monkeypatch):
    monkeypatch.setattr(schedulers, "_fallback", None)
    with pytest.raises(BadInput, match="DPMSolverMultistepScheduler: its NumPy port does not reproduce"):
        schedulers.make_scheduler("default", {**SD15, "_class_name": "DPMSolverMultistepScheduler",
                                              "algorithm_type": "dpmsolver"})
    with pytest.raises(BadInput, match="NoSuchScheduler: no NumPy port, and no diffusers fallback"):
        schedulers.make_scheduler("default", {**SD15, "_class_name": "NoSuchScheduler"})


def fake_unet(x: np.ndarray, t: float) -> np.ndarray:
    """A smooth, timestep-dependent stand-in for the UNet, evaluated in NumPy for both sides so
    that only the schedulers differ."""
    x = np.asarray(x, dtype=np.float32)
    return (np.float32(0.7) * np.tanh(x) + np.float32(0.01 * t / 1000) * np.cos(x)).astype(np.float32)


class NumpySide:
    def __init__(self, seed: int):
        self.generator = TorchGenerator(seed)

    def randn(self, shape):
        return self.generator.randn(shape)

    def array(self, x):
        return np.asarray(x, dtype=np.float32)

    def numpy(self, x):
        return np.asarray(x)

    def step(self, scheduler, model_output, t, latents):
        return scheduler.step(model_output, t, latents, generator=self.generator)


class TorchSide:
    def __init__(self, seed: int):
        self.generator = torch.Generator("cpu").manual_seed(seed)

    def randn(self, shape):
        return torch.randn(shape, generator=self.generator)

    def array(self, x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    def numpy(self, x):
        return x.numpy()

    def step(self, scheduler, model_output, t, latents):
        # diffusers' prepare_extra_step_kwargs: a generator only where step() takes one
        kwargs = {"generator": self.generator} if "generator" in inspect.signature(scheduler.step).parameters else {}
        return scheduler.step(model_output, t, latents, return_dict=False, **kwargs)[0]


@dataclass
class Trace:
    timesteps: np.ndarray
    init_noise_sigma: float
    model_inputs: list = field(default_factory=list)
    latents: np.ndarray | None = None


def denoise(scheduler, side, steps: int, strength: float | None = None) -> Trace:
    """diffusers' txt2img loop, or with `strength` its img2img loop (get_timesteps, add_noise)."""
    scheduler.set_timesteps(steps)
    timesteps = scheduler.timesteps
    if strength is None:
        latents = side.randn(SHAPE) * scheduler.init_noise_sigma
    else:
        t_start = max(steps - min(int(steps * strength), steps), 0)
        timesteps = timesteps[t_start * scheduler.order:]
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(t_start * scheduler.order)
        latents = scheduler.add_noise(side.array(IMAGE_LATENTS), side.randn(SHAPE), timesteps[:1])
    trace = Trace(np.asarray(side.numpy(scheduler.timesteps)), float(scheduler.init_noise_sigma))
    for t in timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        trace.model_inputs.append(np.array(side.numpy(model_input)))
        latents = side.step(scheduler, side.array(fake_unet(side.numpy(model_input), float(t))), t, latents)
    trace.latents = np.array(side.numpy(latents))
    return trace


def assert_parity(ours: Trace, reference: Trace, timestep_rtol: float = 0.0) -> None:
    assert ours.timesteps.dtype == reference.timesteps.dtype
    if timestep_rtol:
        np.testing.assert_allclose(ours.timesteps, reference.timesteps, rtol=timestep_rtol)
    else:
        np.testing.assert_array_equal(ours.timesteps, reference.timesteps)
    np.testing.assert_allclose(ours.init_noise_sigma, reference.init_noise_sigma, rtol=1e-6)
    assert len(ours.model_inputs) == len(reference.model_inputs)
    for step, (a, b) in enumerate(zip(ours.model_inputs, reference.model_inputs, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"model input of step {step}")
    np.testing.assert_allclose(ours.latents, reference.latents, rtol=1e-5, atol=1e-5, err_msg="final latents")


def check_parity(name: str, config: dict, spacing: str | None, steps: int, *, strength=None, seed=0,
                 expect_port=True, timestep_rtol=0.0) -> None:
    ours = schedulers.make_scheduler(name, config, spacing)
    assert isinstance(ours, schedulers.Scheduler) == expect_port, type(ours)
    reference = diffusers_schedulers.diffusers_scheduler(name, config, spacing)
    assert ours.class_name == type(reference).__name__
    assert ours.order == reference.order
    assert_parity(denoise(ours, NumpySide(seed), steps, strength),
                  denoise(reference, TorchSide(seed), steps, strength), timestep_rtol)


def loop_cases():
    for name in (*schedulers.SCHEDULERS, "default"):
        for prediction in ("epsilon", "v_prediction"):
            # LCM has no timestep spacing: its timesteps come from original_inference_steps
            for spacing in (None,) if name == "lcm" else SPACINGS:
                for steps in STEPS:
                    yield pytest.param(name, prediction, spacing, steps, id=f"{name}-{prediction}-{spacing}-{steps}")


@pytest.mark.parametrize("name,prediction,spacing,steps", loop_cases())
def test_port_matches_diffusers(name, prediction, spacing, steps):
    check_parity(name, {**SD15, "prediction_type": prediction}, spacing, steps, seed=steps)


@pytest.mark.parametrize("name", schedulers.SCHEDULERS)
@pytest.mark.parametrize("strength", (0.5, 0.8))
@pytest.mark.parametrize("steps", (4, 20))
@pytest.mark.parametrize("spacing", (None, "trailing"))
def test_img2img_matches_diffusers(name, strength, steps, spacing):
    check_parity(name, SD15, spacing, steps, strength=strength, seed=3)


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("prediction", ("epsilon", "v_prediction"))
def test_euler_karras_sigmas(spacing, prediction):
    # Karras timesteps are fractional, interpolated in log sigmas that come from torch's sqrt (MKL,
    # an ulp off the correctly rounded NumPy sqrt for some inputs): they agree to a few float32 ulps
    for steps in (*STEPS, 50):
        check_parity("euler", {**SD15, "use_karras_sigmas": True, "prediction_type": prediction}, spacing, steps,
                     timestep_rtol=1e-6)


@pytest.mark.parametrize("class_name", schedulers.PORTS)
@pytest.mark.parametrize("variant", ("class defaults", "squaredcos_cap_v2", "trained_betas", "linear sample"))
def test_other_configs(class_name, variant):
    """Missing keys take the class defaults, then the pipeline fixes (steps_offset 0 -> 1, DDIM's
    clip_sample True -> False); the other beta schedules and x0 prediction where ported."""
    config = {"_class_name": class_name, **({"skip_prk_steps": True} if class_name == "PNDMScheduler" else {})}
    config.update({"class defaults": {}, "squaredcos_cap_v2": {"beta_schedule": "squaredcos_cap_v2"},
                   "trained_betas": {"trained_betas": (np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000) ** 2).tolist()},
                   "linear sample": {"beta_schedule": "linear", "prediction_type": "sample"}}[variant])
    ported = schedulers.PORTS[class_name].SUPPORTED["prediction_type"]
    expect_port = config.get("prediction_type", "epsilon") in ported
    for steps in (3, 20):
        if expect_port:
            check_parity("default", config, None, steps)
        else:  # diffusers itself rejects x0 prediction for these classes at step()
            assert isinstance(schedulers.make_scheduler("default", config), diffusers_schedulers.DiffusersAdapter)


@pytest.mark.parametrize("original_steps", (10, 100))
@pytest.mark.parametrize("scaling", (0.05, 10.0))
def test_lcm_options(original_steps, scaling):
    # a small timestep_scaling makes the boundary-condition c_skip matter (at 10, c_skip < 1e-5)
    config = {**SD15, "original_inference_steps": original_steps, "timestep_scaling": scaling}
    for steps in (1, 4, 8):
        check_parity("lcm", config, None, steps)


@pytest.mark.parametrize("name,steps,timestep", [
    *((name, 20, None) for name in ("euler", "euler-a", "ddim", "dpm++", "pndm", "lcm")),
    ("dpm++-2m-karras", 50, 1),  # timestep 1 appears twice: diffusers takes the second
    ("dpm++", 20, 5),  # not in the schedule: DPMSolver takes the last sigma
])
def test_add_noise_finds_the_timestep(name, steps, timestep):
    ours, reference = schedulers.make_scheduler(name, SD15), diffusers_schedulers.diffusers_scheduler(name, SD15)
    ours.set_timesteps(steps)
    reference.set_timesteps(steps)
    if timestep is None:
        timestep = ours.timesteps[steps // 3]
    noise = TorchGenerator(5).randn(SHAPE)
    expected = reference.add_noise(torch.from_numpy(IMAGE_LATENTS), torch.from_numpy(noise),
                                   torch.tensor([timestep.item() if hasattr(timestep, "item") else timestep],
                                                dtype=reference.timesteps.dtype))
    np.testing.assert_allclose(ours.add_noise(IMAGE_LATENTS, noise, np.array([timestep])), expected.numpy(),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("port", schedulers.PORTS.values(), ids=lambda port: port.class_name)
def test_defaults_are_diffusers_defaults(port):
    import diffusers

    parameters = inspect.signature(getattr(diffusers, port.class_name).__init__).parameters
    for key, value in port.DEFAULTS.items():
        if key in parameters:
            assert parameters[key].default == value, key
        else:  # read from the config only when present (diffusers keeps unknown keys)
            assert value is None, key


@pytest.mark.parametrize("spacing", (None, *SPACINGS))
@pytest.mark.parametrize("prediction", ("epsilon", "v_prediction"))
def test_sd15_config_gets_ports(spacing, prediction):
    for name in schedulers.SCHEDULER_CHOICES:
        scheduler = schedulers.make_scheduler(name, {**SD15, "prediction_type": prediction}, spacing)
        assert isinstance(scheduler, schedulers.Scheduler), (name, type(scheduler))
        expected = "PNDMScheduler" if name == "default" else schedulers.SCHEDULERS[name][0]
        assert scheduler.class_name == expected


@pytest.mark.parametrize("name,extra,stochastic", [
    ("ddim", {"thresholding": True}, False),
    ("euler", {"use_exponential_sigmas": True}, False),
    ("dpm++", {"solver_order": 3}, False),
    ("euler-a", {"rescale_betas_zero_snr": True}, True),
    ("lcm", {"thresholding": True}, True),
    ("default", {"_class_name": "DDPMScheduler"}, True),
])
def test_adapter_for_configs_without_port(name, extra, stochastic):
    config = {**SD15, **extra}
    class_name, name_config = schedulers.SCHEDULERS.get(name, (extra.get("_class_name"), {}))
    port = schedulers.PORTS.get(class_name)
    if port is not None:
        with pytest.raises(schedulers.UnsupportedConfig):
            port({**config, **name_config})
    for steps in (4, 20):
        check_parity(name, config, None, steps, seed=11, expect_port=False)
    if stochastic:  # the steps drew from our generator (parity above says: in diffusers' order)
        side = NumpySide(11)
        denoise(schedulers.make_scheduler(name, config), side, 4)
        untouched = TorchGenerator(11)
        untouched.randn(SHAPE)
        assert not np.array_equal(side.randn(SHAPE), untouched.randn(SHAPE))


def test_adapter_img2img():
    check_parity("euler-a", {**SD15, "rescale_betas_zero_snr": True}, "trailing", 20, strength=0.5,
                 expect_port=False)


@pytest.mark.parametrize("name,config,message", [
    ("heun", SD15, "choose from"),
    ("default", {k: v for k, v in SD15.items() if k != "_class_name"}, "has no _class_name"),
    ("default", {**SD15, "_class_name": "NoSuchScheduler"}, "not a diffusers scheduler"),
    ("default", {**SD15, "_class_name": "UNet2DConditionModel"}, "not a diffusers scheduler"),
    ("default", {**SD15, "_class_name": "DPMSolverMultistepScheduler", "algorithm_type": "dpmsolver"},
     "cannot build DPMSolverMultistepScheduler"),
    ("euler", {**SD15, "beta_schedule": "cubic"}, "cannot build EulerDiscreteScheduler"),
    ("euler", {**SD15, "use_karras_sigmas": True, "use_exponential_sigmas": True}, "cannot build"),
])
def test_bad_input(name, config, message):
    for build in (schedulers.make_scheduler, diffusers_schedulers.diffusers_scheduler):
        with pytest.raises(BadInput, match=message):
            build(name, config)


def test_name_settings_override_the_config():
    scheduler = schedulers.make_scheduler("dpm++", {**SD15, "algorithm_type": "dpmsolver"})
    assert isinstance(scheduler, schedulers.Scheduler) and scheduler.config["algorithm_type"] == "dpmsolver++"


def test_bad_timestep_spacing():
    with pytest.raises(BadInput, match="timestep-spacing"):
        schedulers.make_scheduler("euler", SD15, "cosine")


def test_torch_linspace_is_bit_exact():
    for start, end, count in ((0.0001, 0.02, 1000), (0.00085 ** 0.5, 0.012 ** 0.5, 1000), (0.1, 0.9, 37),
                              (0.3, 0.2, 2), (0.5, 0.7, 1), (1e-4, 3e-2, 1001)):
        expected = torch.linspace(start, end, count, dtype=torch.float32).numpy()
        np.testing.assert_array_equal(schedulers.torch_linspace(start, end, count), expected)


@pytest.mark.parametrize("name", ("euler", "euler-a", "dpm++", "dpm++-2m-karras"))
def test_sigmas_match_to_float32_rounding(name):
    for spacing in SPACINGS:
        ours = schedulers.make_scheduler(name, SD15, spacing)
        reference = diffusers_schedulers.diffusers_scheduler(name, SD15, spacing)
        ours.set_timesteps(20)
        reference.set_timesteps(20)
        np.testing.assert_array_max_ulp(ours.sigmas, reference.sigmas.numpy(), maxulp=1)


@pytest.mark.parametrize("name", ("euler", "euler-a", "ddim", "dpm++", "pndm", "lcm"))
def test_the_check_can_fail(name):
    """A port with another spacing, or a slightly different beta_end, is caught."""
    reference = denoise(diffusers_schedulers.diffusers_scheduler(name, SD15, "leading"), TorchSide(0), 20)
    mutated = denoise(schedulers.make_scheduler(name, {**SD15, "beta_end": 0.0121}, "leading"), NumpySide(0), 20)
    with pytest.raises(AssertionError):
        assert_parity(mutated, reference)
    assert not np.allclose(mutated.latents, reference.latents, rtol=1e-5, atol=1e-5)
    if name != "lcm":  # LCM ignores timestep_spacing
        with pytest.raises(AssertionError):
            assert_parity(denoise(schedulers.make_scheduler(name, SD15, "trailing"), NumpySide(0), 20), reference)


def test_lcm_rejects_more_steps_than_original_like_diffusers():
    for build in (schedulers.make_scheduler, diffusers_schedulers.diffusers_scheduler):
        with pytest.raises(ValueError):
            build("lcm", SD15).set_timesteps(51)


def test_import_needs_neither_torch_nor_diffusers():
    code = ("import sys, difflite.runtime.schedulers as s, difflite.runtime.noise; "
            f"sched = s.make_scheduler('pndm', {SD15!r}); sched.set_timesteps(20); "
            "sched.step(difflite.runtime.noise.TorchGenerator(0).randn((1, 4, 8, 8)), sched.timesteps[0], "
            "difflite.runtime.noise.TorchGenerator(1).randn((1, 4, 8, 8))); "
            "assert 'torch' not in sys.modules and 'diffusers' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers'))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
