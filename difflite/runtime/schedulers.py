"""NumPy (float32) ports of the diffusers 0.42.1 schedulers Stable Diffusion uses, so that
`difflite generate` runs its denoising loop without importing torch or diffusers.

Ported: EulerDiscreteScheduler (incl. Karras sigmas), EulerAncestralDiscreteScheduler,
DDIMScheduler (eta 0), DPMSolverMultistepScheduler (dpmsolver++, order 1-2, midpoint, Karras or
interpolated sigmas, final sigma zero), PNDMScheduler (skip_prk_steps) and LCMScheduler. Each port
lists the config values it reproduces (SUPPORTED) and diffusers' defaults for the keys it reads
(DEFAULTS). Fallback rule: `make_scheduler` returns a port only when the class has one and every
value in its SUPPORTED table is covered; anything else gets the installed fallback: the command line's is
difflite/diffusers_schedulers.py, the real diffusers scheduler behind the same NumPy interface.

The config goes through the fixes of diffusers' StableDiffusionPipeline constructor, which looks at
the built scheduler's config (class defaults included): steps_offset != 1 -> 1, clip_sample True
-> False; not for SDXL (pipeline_fixes=False), whose pipelines take the config as it is. Stochastic steps draw `generator.randn(shape)` (difflite.runtime.noise.TorchGenerator) where
diffusers calls randn_tensor with a torch generator, in the same order and shape.

Numerics follow diffusers' dtype path: float32 tensors, torch's cumprod (accumulates in double),
torch.linspace's exact float32 formula, NumPy float64 where diffusers builds sigmas in NumPy.
torch's vectorised sqrt/log/exp are not correctly rounded, so values agree to an ulp or so, not
bit for bit."""

from __future__ import annotations

import math
from types import MappingProxyType

import numpy as np

from difflite.core.errors import BadInput

SCHEDULERS = {
    # name: (diffusers class, extra config)
    "euler": ("EulerDiscreteScheduler", {}),
    "euler-a": ("EulerAncestralDiscreteScheduler", {}),
    "ddim": ("DDIMScheduler", {}),
    "dpm++": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++"}),
    "dpm++-2m-karras": ("DPMSolverMultistepScheduler",
                        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True}),
    "pndm": ("PNDMScheduler", {}),
    "lcm": ("LCMScheduler", {}),
}
SCHEDULER_CHOICES = (*SCHEDULERS, "default")
SPACINGS = ("leading", "trailing", "linspace")
F32 = np.float32


class UnsupportedConfig(Exception):
    """A port cannot reproduce this config exactly (make_scheduler then uses DiffusersAdapter)."""


# ---------------------------------------------------------------------------------------------
# Config


def resolve(name: str, config: dict, timestep_spacing: str | None) -> tuple[str, dict]:
    """(diffusers class name, config with the name's extra values and the spacing override)."""
    if name == "default":
        class_name, extra = config.get("_class_name"), {}
        if not class_name:
            raise BadInput("scheduler_config.json has no _class_name: pass --scheduler " + "|".join(SCHEDULERS))
    elif name in SCHEDULERS:
        class_name, extra = SCHEDULERS[name]
    else:
        raise BadInput(f"--scheduler {name!r}: choose from {', '.join(SCHEDULER_CHOICES)}")
    if timestep_spacing is not None and timestep_spacing not in SPACINGS:
        raise BadInput(f"--timestep-spacing {timestep_spacing!r}: choose from {', '.join(SPACINGS)}")
    merged = {**config, **extra}
    if timestep_spacing is not None:
        merged["timestep_spacing"] = timestep_spacing
    return str(class_name), merged


def pipeline_fixes(effective) -> dict:
    """What StableDiffusionPipeline.__init__ rewrites in a scheduler's (effective) config."""
    fixes = {}
    if effective.get("steps_offset", 1) != 1:
        fixes["steps_offset"] = 1
    if effective.get("clip_sample", False) is True:
        fixes["clip_sample"] = False
    return fixes


# What builds a scheduler no port reproduces. The runtime imports no diffusers: the command layer
# installs difflite/diffusers_schedulers.py's builder here (use_fallback), so `difflite generate`
# still runs such a config, through diffusers.
_fallback = None


def use_fallback(build) -> None:
    """Install build(name, config, timestep_spacing) -> scheduler for configs no port reproduces."""
    global _fallback
    _fallback = build


def make_scheduler(name: str, config: dict, timestep_spacing: str | None = None, pipeline_fixes: bool = True):
    """A NumPy port when one reproduces the class and config, else the installed fallback's.
    pipeline_fixes: apply StableDiffusionPipeline's config fixes (SD 1.x / 2.x; SDXL: False)."""
    class_name, merged = resolve(name, config, timestep_spacing)
    port = PORTS.get(class_name)
    reason = "no NumPy port"
    if port is not None:
        try:
            return port(merged, pipeline_fixes)
        except (UnsupportedConfig, ValueError, TypeError) as exc:  # the fallback builds it or says why not
            reason = f"its NumPy port does not reproduce this config ({exc})"
    if _fallback is None:
        raise BadInput(f"scheduler_config.json: {class_name}: {reason}, and no diffusers fallback is installed "
                       f"(the difflite command installs one)")
    return _fallback(name, config, timestep_spacing, pipeline_fixes=pipeline_fixes)


# ---------------------------------------------------------------------------------------------
# Noise schedules as diffusers computes them


def torch_linspace(start: float, end: float, count: int) -> np.ndarray:
    """torch.linspace(start, end, count, dtype=torch.float32) bit for bit: each half is computed
    from its own end, and torch's build contracts `start + step * i` into one fused multiply-add
    (exact product, one rounding), which float64 arithmetic reproduces."""
    start, end = F32(start), F32(end)
    if count == 1:
        return np.array([start], dtype=F32)
    step = np.float64(F32((end - start) / F32(count - 1)))
    index = np.arange(count)
    from_start = (np.float64(start) + step * index).astype(F32)
    from_end = (np.float64(end) - step * (count - 1 - index)).astype(F32)
    return np.where(index < count // 2, from_start, from_end)


def _cosine_betas(count: int, max_beta: float = 0.999) -> np.ndarray:
    def alpha_bar(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
    return np.array([min(1 - alpha_bar((i + 1) / count) / alpha_bar(i / count), max_beta) for i in range(count)],
                    dtype=F32)


def _betas(config: dict) -> np.ndarray:
    if config["trained_betas"] is not None:
        return np.asarray(config["trained_betas"], dtype=F32)
    count, schedule = config["num_train_timesteps"], config["beta_schedule"]
    if schedule == "linear":
        return torch_linspace(config["beta_start"], config["beta_end"], count)
    if schedule == "scaled_linear":
        root = torch_linspace(config["beta_start"] ** 0.5, config["beta_end"] ** 0.5, count)
        return root * root
    return _cosine_betas(count)


def _spaced_timesteps(spacing: str, count: int, train_steps: int, offset: int) -> np.ndarray:
    """Descending float64 timesteps of diffusers' three spacings (linspace not yet rounded)."""
    if spacing == "linspace":
        return np.linspace(0, train_steps - 1, count)[::-1].copy()
    if spacing == "leading":
        return (np.arange(0, count) * (train_steps // count)).round()[::-1] + offset
    return np.arange(train_steps, 0, -train_steps / count).round() - 1


def _karras_sigmas(sigma_min: float, sigma_max: float, count: int, rho: float = 7.0) -> np.ndarray:
    ramp = np.linspace(0, 1, count)
    min_inv_rho, max_inv_rho = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho


def _sigma_to_t(sigmas: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """The fractional training timestep of each sigma (log-linear interpolation)."""
    log_sigma = np.log(np.maximum(sigmas, 1e-10))
    distances = log_sigma - log_sigmas[:, np.newaxis]
    low = np.cumsum(distances >= 0, axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    weight = np.clip((log_sigmas[low] - log_sigma) / (log_sigmas[low] - log_sigmas[low + 1]), 0, 1)
    return (1 - weight) * low + weight * (low + 1)


# ---------------------------------------------------------------------------------------------
# Ports


def _table(base=None, **entries) -> MappingProxyType:
    return MappingProxyType({**(base or {}), **entries})


_DEFAULTS = _table(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
                   trained_betas=None, prediction_type="epsilon", steps_offset=0, rescale_betas_zero_snr=False)
_BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
_PREDICTIONS = ("epsilon", "v_prediction", "sample")
_PLAIN = _table(rescale_betas_zero_snr=(False,))


class Scheduler:
    """Base of the ports: the noise schedule, step counting and alpha-based add_noise."""

    class_name = ""
    order = 1
    init_noise_sigma = 1.0
    DEFAULTS = _DEFAULTS  # diffusers' __init__ defaults of the keys the port reads
    SUPPORTED = _PLAIN  # config key -> the values the port reproduces

    def __init__(self, config: dict, fixes: bool = True):
        effective = {**self.DEFAULTS, **config}
        if fixes:
            effective.update(pipeline_fixes(effective))
        unsupported = [f"{key}={effective[key]!r}" for key, values in self.SUPPORTED.items()
                       if effective[key] not in values]
        if effective["trained_betas"] is None and effective["beta_schedule"] not in _BETA_SCHEDULES:
            unsupported.append(f"beta_schedule={effective['beta_schedule']!r}")
        if unsupported:
            raise UnsupportedConfig(f"{self.class_name}: {', '.join(unsupported)}")
        self.config = effective
        self.alphas_cumprod = np.cumprod((F32(1) - _betas(effective)).astype(np.float64)).astype(F32)
        self.final_alpha_cumprod = F32(1) if effective.get("set_alpha_to_one") else self.alphas_cumprod[0]
        self.timesteps = self.num_inference_steps = self.step_index = self.begin_index = None

    def _spaced(self, count: int) -> np.ndarray:
        c = self.config
        return _spaced_timesteps(c["timestep_spacing"], count, c["num_train_timesteps"], c["steps_offset"])

    def _training_sigmas(self) -> np.ndarray:
        return np.sqrt((F32(1) - self.alphas_cumprod) / self.alphas_cumprod)

    def _karras(self, sigmas: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Karras sigmas spanning `sigmas` (descending) or the config's sigma_min/sigma_max, and
        their fractional training timesteps."""
        low, high = self.config.get("sigma_min"), self.config.get("sigma_max")
        karras = _karras_sigmas(sigmas[-1].item() if low is None else low, sigmas[0].item() if high is None else high,
                                count)
        return karras, _sigma_to_t(karras, np.log(self._training_sigmas()))

    def set_begin_index(self, begin_index: int) -> None:
        self.begin_index = begin_index

    def scale_model_input(self, sample: np.ndarray, timestep) -> np.ndarray:
        return sample

    def _index_for_timestep(self, timestep) -> int:
        # diffusers takes the second match when a timestep repeats
        matches = np.flatnonzero(self.timesteps == scalar(timestep))
        return int(matches[1] if len(matches) > 1 else matches[0])

    def _start_step(self, timestep) -> None:
        if self.step_index is None:
            self.step_index = self.begin_index if self.begin_index is not None else self._index_for_timestep(timestep)

    def _noise_index(self, timestep) -> int:
        if self.begin_index is None:
            return self._index_for_timestep(timestep)
        return self.step_index if self.step_index is not None else self.begin_index

    def add_noise(self, original: np.ndarray, noise: np.ndarray, timestep) -> np.ndarray:
        alpha_prod = self.alphas_cumprod[int(scalar(timestep))]
        return np.sqrt(alpha_prod) * _f32(original) + np.sqrt(F32(1) - alpha_prod) * _f32(noise)

    def _alphas_at(self, timestep: int, prev_timestep: int):
        alpha_prod = self.alphas_cumprod[timestep]
        return alpha_prod, self.alphas_cumprod[prev_timestep] if prev_timestep >= 0 else self.final_alpha_cumprod


def scalar(timestep):
    return np.asarray(timestep).reshape(-1)[0]


def _f32(array) -> np.ndarray:
    return np.asarray(array, dtype=F32)


def _randn(generator, shape) -> np.ndarray:
    if generator is None:  # diffusers would use torch's global generator: any normal noise will do
        return np.random.default_rng().standard_normal(shape).astype(F32)
    return _f32(generator.randn(shape))


def _original_and_epsilon(prediction_type: str, model_output, sample, alpha_prod):
    """(predicted x_0, predicted noise) of the alpha-parametrised schedulers."""
    alpha, beta = np.sqrt(alpha_prod), np.sqrt(F32(1) - alpha_prod)
    if prediction_type == "epsilon":
        return (sample - beta * model_output) / alpha, model_output
    if prediction_type == "v_prediction":
        return alpha * sample - beta * model_output, alpha * model_output + beta * sample
    return model_output, (sample - alpha * model_output) / beta


class _SigmaScheduler(Scheduler):
    """Euler-style schedulers: x_t = x_0 + sigma * noise, model input scaled by 1/sqrt(sigma^2+1)."""

    karras = False

    def __init__(self, config: dict, fixes: bool = True):
        super().__init__(config, fixes)
        self.sigmas = np.concatenate([self._training_sigmas()[::-1], [F32(0)]])

    @property
    def init_noise_sigma(self) -> float:
        max_sigma = self.sigmas.max()
        if self.config["timestep_spacing"] in ("linspace", "trailing"):
            return float(max_sigma)
        return float(np.sqrt(max_sigma * max_sigma + F32(1)))

    def set_timesteps(self, num_inference_steps: int) -> None:
        self.num_inference_steps = num_inference_steps
        timesteps = self._spaced(num_inference_steps).astype(F32)
        training = self._training_sigmas()
        sigmas = np.interp(timesteps, np.arange(len(training)), training)
        if self.karras:
            sigmas, timesteps = self._karras(sigmas, num_inference_steps)
        self.timesteps = timesteps.astype(F32)
        self.sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        self.step_index = self.begin_index = None

    def scale_model_input(self, sample: np.ndarray, timestep) -> np.ndarray:
        self._start_step(timestep)
        sigma = self.sigmas[self.step_index]
        return _f32(sample) / np.sqrt(sigma * sigma + F32(1))

    def add_noise(self, original: np.ndarray, noise: np.ndarray, timestep) -> np.ndarray:
        return _f32(original) + _f32(noise) * self.sigmas[self._noise_index(timestep)]

    def _derivative(self, model_output, sample, sigma):
        """(sample - predicted x_0) / sigma."""
        if self.config["prediction_type"] == "epsilon":
            original = sample - sigma * model_output
        elif self.config["prediction_type"] == "v_prediction":
            original = model_output * (-sigma / np.sqrt(sigma * sigma + F32(1))) + sample / (sigma * sigma + F32(1))
        else:
            original = model_output
        return (sample - original) / sigma


class EulerDiscrete(_SigmaScheduler):
    class_name = "EulerDiscreteScheduler"
    DEFAULTS = _table(_DEFAULTS, interpolation_type="linear", use_karras_sigmas=False, use_exponential_sigmas=False,
                      use_beta_sigmas=False, sigma_min=None, sigma_max=None, timestep_spacing="linspace",
                      timestep_type="discrete", final_sigmas_type="zero")
    SUPPORTED = _table(_PLAIN, prediction_type=(*_PREDICTIONS, "original_sample"), timestep_spacing=SPACINGS,
                       interpolation_type=("linear",), use_karras_sigmas=(False, True), use_exponential_sigmas=(False,),
                       use_beta_sigmas=(False,), timestep_type=("discrete",), final_sigmas_type=("zero",))

    @property
    def karras(self) -> bool:
        return self.config["use_karras_sigmas"]

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        self._start_step(timestep)
        sample = _f32(sample)
        sigma, sigma_next = self.sigmas[self.step_index], self.sigmas[self.step_index + 1]
        self.step_index += 1
        return sample + self._derivative(_f32(model_output), sample, sigma) * (sigma_next - sigma)


class EulerAncestralDiscrete(_SigmaScheduler):
    class_name = "EulerAncestralDiscreteScheduler"
    DEFAULTS = _table(_DEFAULTS, timestep_spacing="linspace")
    SUPPORTED = _table(_PLAIN, prediction_type=("epsilon", "v_prediction"), timestep_spacing=SPACINGS)

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        self._start_step(timestep)
        model_output, sample = _f32(model_output), _f32(sample)
        sigma, sigma_to = self.sigmas[self.step_index], self.sigmas[self.step_index + 1]
        sigma_up = np.sqrt(sigma_to * sigma_to * (sigma * sigma - sigma_to * sigma_to) / (sigma * sigma))
        sigma_down = np.sqrt(sigma_to * sigma_to - sigma_up * sigma_up)
        prev_sample = sample + self._derivative(model_output, sample, sigma) * (sigma_down - sigma)
        self.step_index += 1
        return prev_sample + _randn(generator, model_output.shape) * sigma_up


class DDIM(Scheduler):
    class_name = "DDIMScheduler"
    DEFAULTS = _table(_DEFAULTS, clip_sample=True, set_alpha_to_one=True, thresholding=False,
                      timestep_spacing="leading")
    SUPPORTED = _table(_PLAIN, prediction_type=_PREDICTIONS, timestep_spacing=SPACINGS, clip_sample=(False,),
                       thresholding=(False,))

    def set_timesteps(self, num_inference_steps: int) -> None:
        if num_inference_steps > self.config["num_train_timesteps"]:
            raise ValueError(f"num_inference_steps {num_inference_steps} > num_train_timesteps")
        self.num_inference_steps = num_inference_steps
        self.timesteps = self._spaced(num_inference_steps).round().astype(np.int64)

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        timestep = int(scalar(timestep))
        alpha_prod, alpha_prod_prev = self._alphas_at(
            timestep, timestep - self.config["num_train_timesteps"] // self.num_inference_steps)
        original, epsilon = _original_and_epsilon(self.config["prediction_type"], _f32(model_output), _f32(sample),
                                                  alpha_prod)
        return np.sqrt(alpha_prod_prev) * original + np.sqrt(F32(1) - alpha_prod_prev) * epsilon


class DPMSolverMultistep(Scheduler):
    class_name = "DPMSolverMultistepScheduler"
    DEFAULTS = _table(_DEFAULTS, solver_order=2, thresholding=False, algorithm_type="dpmsolver++",
                      solver_type="midpoint", lower_order_final=True, euler_at_final=False, use_karras_sigmas=False,
                      use_exponential_sigmas=False, use_beta_sigmas=False, use_lu_lambdas=False, use_flow_sigmas=False,
                      final_sigmas_type="zero", lambda_min_clipped=-math.inf, variance_type=None,
                      timestep_spacing="linspace")
    # lower_order_final and euler_at_final only matter for the last step, which final_sigmas_type
    # "zero" makes first order anyway, and for third-order steps, which are not ported
    SUPPORTED = _table(_PLAIN, prediction_type=_PREDICTIONS, timestep_spacing=SPACINGS, solver_order=(1, 2),
                       thresholding=(False,), algorithm_type=("dpmsolver++",), solver_type=("midpoint",),
                       use_karras_sigmas=(False, True), use_exponential_sigmas=(False,), use_beta_sigmas=(False,),
                       use_lu_lambdas=(False,), use_flow_sigmas=(False,), final_sigmas_type=("zero",),
                       lambda_min_clipped=(-math.inf,), variance_type=(None,))

    def set_timesteps(self, num_inference_steps: int) -> None:
        c = self.config
        points = num_inference_steps + (c["timestep_spacing"] != "trailing")
        timesteps = self._spaced(points)[:num_inference_steps].round().astype(np.int64)
        training = self._training_sigmas()
        if c["use_karras_sigmas"]:
            sigmas, timesteps = self._karras(training[::-1], num_inference_steps)
            if c["beta_schedule"] != "squaredcos_cap_v2":
                timesteps = timesteps.round()
        else:
            sigmas = np.interp(timesteps, np.arange(len(training)), training)
        self.sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        self.timesteps = timesteps.astype(np.int64)
        self.num_inference_steps = len(self.timesteps)
        self.model_outputs = [None] * c["solver_order"]
        self.lower_order_nums = 0
        self.step_index = self.begin_index = None

    def _index_for_timestep(self, timestep) -> int:
        if not np.any(self.timesteps == scalar(timestep)):
            return len(self.timesteps) - 1
        return super()._index_for_timestep(timestep)

    def _alpha_sigma_lambda(self, index: int):
        sigma = self.sigmas[index]
        alpha = F32(1) / np.sqrt(sigma * sigma + F32(1))
        with np.errstate(divide="ignore"):  # the final sigma is 0: lambda = +inf, as in torch
            return alpha, sigma * alpha, np.log(alpha) - np.log(sigma * alpha)

    def _predict_original(self, model_output, sample):
        alpha, sigma, _ = self._alpha_sigma_lambda(self.step_index)
        if self.config["prediction_type"] == "epsilon":
            return (sample - sigma * model_output) / alpha
        if self.config["prediction_type"] == "v_prediction":
            return alpha * sample - sigma * model_output
        return model_output

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        self._start_step(timestep)
        sample, index = _f32(sample), self.step_index
        self.model_outputs = self.model_outputs[1:] + [self._predict_original(_f32(model_output), sample)]
        alpha_t, sigma_t, lambda_t = self._alpha_sigma_lambda(index + 1)
        _, sigma_s0, lambda_s0 = self._alpha_sigma_lambda(index)
        h = lambda_t - lambda_s0
        d0 = self.model_outputs[-1]
        prev_sample = sigma_t / sigma_s0 * sample - alpha_t * (np.exp(-h) - F32(1)) * d0
        last = index == len(self.timesteps) - 1
        if self.config["solver_order"] == 2 and self.lower_order_nums >= 1 and not last:  # midpoint 2M
            lambda_s1 = self._alpha_sigma_lambda(index - 1)[2]
            d1 = F32(1) / ((lambda_s0 - lambda_s1) / h) * (d0 - self.model_outputs[-2])
            prev_sample = prev_sample - F32(0.5) * (alpha_t * (np.exp(-h) - F32(1))) * d1
        self.lower_order_nums = min(self.lower_order_nums + 1, self.config["solver_order"])
        self.step_index += 1
        return prev_sample

    def add_noise(self, original: np.ndarray, noise: np.ndarray, timestep) -> np.ndarray:
        alpha, sigma, _ = self._alpha_sigma_lambda(self._noise_index(timestep))
        return alpha * _f32(original) + sigma * _f32(noise)


class PNDM(Scheduler):
    class_name = "PNDMScheduler"
    DEFAULTS = _table({k: v for k, v in _DEFAULTS.items() if k != "rescale_betas_zero_snr"},
                      skip_prk_steps=False, set_alpha_to_one=False, timestep_spacing="leading")
    SUPPORTED = _table(prediction_type=("epsilon", "v_prediction"), timestep_spacing=SPACINGS, skip_prk_steps=(True,))

    def set_timesteps(self, num_inference_steps: int) -> None:
        self.num_inference_steps = num_inference_steps
        ascending = self._spaced(num_inference_steps)[::-1].round()
        # PLMS without Runge-Kutta warm-up repeats the second timestep (its second step re-evaluates)
        self.timesteps = np.concatenate([ascending[:-1], ascending[-2:-1], ascending[-1:]])[::-1].astype(np.int64)
        self.ets, self.counter, self.cur_sample = [], 0, None

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        model_output, sample, timestep = _f32(model_output), _f32(sample), int(scalar(timestep))
        ratio = self.config["num_train_timesteps"] // self.num_inference_steps
        prev_timestep = timestep - ratio
        if self.counter != 1:
            self.ets = self.ets[-3:] + [model_output]
        else:
            prev_timestep, timestep = timestep, timestep + ratio
        ets = self.ets
        if len(ets) == 1 and self.counter == 0:
            self.cur_sample = sample
        elif len(ets) == 1 and self.counter == 1:
            model_output = (model_output + ets[-1]) / F32(2)
            sample, self.cur_sample = self.cur_sample, None
        elif len(ets) == 2:
            model_output = (F32(3) * ets[-1] - ets[-2]) / F32(2)
        elif len(ets) == 3:
            model_output = (F32(23) * ets[-1] - F32(16) * ets[-2] + F32(5) * ets[-3]) / F32(12)
        else:
            model_output = F32(1 / 24) * (F32(55) * ets[-1] - F32(59) * ets[-2] + F32(37) * ets[-3] - F32(9) * ets[-4])
        self.counter += 1
        return self._prev_sample(sample, timestep, prev_timestep, model_output)

    def _prev_sample(self, sample, timestep: int, prev_timestep: int, model_output):
        alpha_prod, alpha_prod_prev = self._alphas_at(timestep, prev_timestep)
        beta_prod, beta_prod_prev = F32(1) - alpha_prod, F32(1) - alpha_prod_prev
        if self.config["prediction_type"] == "v_prediction":
            model_output = np.sqrt(alpha_prod) * model_output + np.sqrt(beta_prod) * sample
        sample_coeff = np.sqrt(alpha_prod_prev / alpha_prod)
        denominator = alpha_prod * np.sqrt(beta_prod_prev) + np.sqrt(alpha_prod * beta_prod * alpha_prod_prev)
        return sample_coeff * sample - (alpha_prod_prev - alpha_prod) * model_output / denominator


class LCM(Scheduler):
    class_name = "LCMScheduler"
    DEFAULTS = _table(_DEFAULTS, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                      original_inference_steps=50, clip_sample=False, set_alpha_to_one=True, thresholding=False,
                      timestep_scaling=10.0, timestep_spacing="leading")
    SUPPORTED = _table(_PLAIN, prediction_type=_PREDICTIONS, clip_sample=(False,), thresholding=(False,))

    def set_timesteps(self, num_inference_steps: int) -> None:
        train_steps, original_steps = self.config["num_train_timesteps"], self.config["original_inference_steps"]
        if num_inference_steps > min(train_steps, original_steps) or original_steps > train_steps:
            raise ValueError(f"LCMScheduler: {num_inference_steps} steps exceed original_inference_steps "
                             f"{original_steps} or num_train_timesteps {train_steps}")
        origin = (np.arange(1, original_steps + 1) * (train_steps // original_steps) - 1)[::-1]
        picks = np.floor(np.linspace(0, len(origin), num=num_inference_steps, endpoint=False)).astype(np.int64)
        self.timesteps = origin[picks].astype(np.int64)
        self.num_inference_steps = num_inference_steps
        self.step_index = self.begin_index = None

    def step(self, model_output: np.ndarray, timestep, sample: np.ndarray, generator=None) -> np.ndarray:
        self._start_step(timestep)
        model_output, sample, timestep = _f32(model_output), _f32(sample), int(scalar(timestep))
        next_index = self.step_index + 1
        prev_timestep = int(self.timesteps[next_index]) if next_index < len(self.timesteps) else timestep
        alpha_prod, alpha_prod_prev = self._alphas_at(timestep, prev_timestep)
        original, _ = _original_and_epsilon(self.config["prediction_type"], model_output, sample, alpha_prod)
        # consistency-model boundary condition (sigma_data 0.5): c_skip(0) = 1, c_out(0) = 0
        scaled = F32(timestep) * F32(self.config["timestep_scaling"])
        c_skip = F32(0.25) / (scaled * scaled + F32(0.25))
        c_out = scaled / np.sqrt(scaled * scaled + F32(0.25))
        denoised = c_out * original + c_skip * sample
        final = self.step_index == self.num_inference_steps - 1
        self.step_index += 1
        if final:
            return denoised
        noise = _randn(generator, model_output.shape)
        return np.sqrt(alpha_prod_prev) * denoised + np.sqrt(F32(1) - alpha_prod_prev) * noise


PORTS = {port.class_name: port for port in (EulerDiscrete, EulerAncestralDiscrete, DDIM, DPMSolverMultistep, PNDM, LCM)}


__all__ = ["SCHEDULERS", "SCHEDULER_CHOICES", "Scheduler", "UnsupportedConfig", "make_scheduler", "use_fallback"]
