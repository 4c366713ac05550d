"""Unfused baselines (unfused.cl): the fused difflite ops as chains of separate kernels with
full-size temporaries, as a graph of builtin operators would run them. Each function enqueues the
chain on runner.queue and returns its events; `temps` lists the temporaries it allocated (bytes).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyopencl as cl

from .launch import Runner, ceil_div, round_up

UNFUSED_CL = Path(__file__).resolve().parent / "unfused.cl"
WG = 256
i32, f32 = np.int32, np.float32


def group_mean_splits(n: int, groups: int, spatial: int, cg: int, compute_units: int) -> int:
    """Work-groups per (sample, group) of un_group_sum_partial: enough to fill the device, at least
    ~16 elements per work-item."""
    want = ceil_div(4 * max(1, compute_units), n * groups)
    by_size = max(1, (spatial * cg) // (WG * 16))
    return max(1, min(want, by_size, 64, spatial))


class Unfused:
    def __init__(self, runner: Runner):
        self.r = runner
        self.prog = runner.program(UNFUSED_CL)
        self._k: dict[str, cl.Kernel] = {}
        self._temps: dict[tuple[str, int], cl.Buffer] = {}
        self.temp_bytes: dict[str, int] = {}  # per baseline: bytes of its temporaries

    def k(self, name: str) -> cl.Kernel:
        if name not in self._k:
            self._k[name] = cl.Kernel(self.prog, name)
        return self._k[name]

    def temp(self, tag: str, idx: int, nbytes: int, small: bool = False) -> cl.Buffer:
        """Temporary `idx` of baseline `tag` (allocated once; counted in temp_bytes)."""
        key = (tag, idx)
        buf = self._temps.get(key)
        if buf is None or buf.size < nbytes:
            buf = cl.Buffer(self.r.ctx, cl.mem_flags.READ_WRITE, max(4, nbytes))
            self._temps[key] = buf
            self.temp_bytes[tag] = self.temp_bytes.get(tag, 0) + nbytes
        return buf

    def ew(self, name: str, n: int, *args) -> cl.Event:
        return self.r.launch(self.k(name), (round_up(n, WG),), (WG,), *args)

    # ------------------------------------------------------------------ GroupNorm + SiLU
    def group_norm(self, x, gamma, beta, y, shape, groups: int, eps: float, silu: bool = True):
        """mean, sub, square, mean, add-eps/rsqrt, mul, mul gamma, add beta[, sigmoid, mul]."""
        tag = "group_norm"
        n, c = int(shape[0]), int(shape[-1])
        s = int(np.prod(shape[1:-1]))
        cg = c // groups
        total = n * s * c
        nb = 4 * total
        splits = group_mean_splits(n, groups, s, cg, self.r.compute_units)
        part = self.temp(tag, 0, 4 * n * groups * splits)
        mean, var, rstd = (self.temp(tag, i, 4 * n * groups) for i in (1, 2, 3))
        t = [self.temp(tag, 10 + i, nb) for i in range(6)]  # full-size temporaries
        ng = n * groups
        ev = []

        def group_mean(src, dst):
            ev.append(self.r.launch(self.k("un_group_sum_partial"), (WG * groups, splits, n), (WG, 1, 1),
                                    src, part, i32(s), i32(c), i32(cg), i32(splits)))
            ev.append(self.ew("un_group_mean_final", ng, part, dst, i32(ng), i32(splits), f32(1.0 / (s * cg))))

        group_mean(x, mean)  # mean
        ev.append(self.ew("un_sub_group", total, x, mean, t[0], i32(total), i32(s), i32(c), i32(cg),
                          i32(groups)))  # d = x - mean
        ev.append(self.ew("un_square", total, t[0], t[1], i32(total)))  # d^2
        group_mean(t[1], var)  # var
        ev.append(self.ew("un_add_eps_rsqrt", ng, var, rstd, i32(ng), f32(eps)))  # rsqrt(var + eps)
        ev.append(self.ew("un_mul_group", total, t[0], rstd, t[2], i32(total), i32(s), i32(c), i32(cg),
                          i32(groups)))  # d * rstd
        ev.append(self.ew("un_mul_channel", total, t[2], gamma, t[3], i32(total), i32(c)))  # * gamma
        if not silu:
            ev.append(self.ew("un_add_channel", total, t[3], beta, y, i32(total), i32(c)))
            return ev
        ev.append(self.ew("un_add_channel", total, t[3], beta, t[4], i32(total), i32(c)))  # + beta
        ev.append(self.ew("un_sigmoid", total, t[4], t[5], i32(total)))  # sigmoid
        ev.append(self.ew("un_mul", total, t[4], t[5], y, i32(total)))  # x * sigmoid(x)
        return ev

    # ------------------------------------------------------------------ GELU (erf)
    def _gelu_chain(self, tag, x, y, count: int, first_temp: int):
        t = [self.temp(tag, first_temp + i, 4 * count) for i in range(4)]
        return [
            self.ew("un_scale", count, x, t[0], i32(count), f32(1.0 / math.sqrt(2.0))),  # x / sqrt 2
            self.ew("un_erf", count, t[0], t[1], i32(count)),  # erf
            self.ew("un_add_scalar", count, t[1], t[2], i32(count), f32(1.0)),  # + 1
            self.ew("un_scale", count, t[2], t[3], i32(count), f32(0.5)),  # * 0.5
            self.ew("un_mul", count, x, t[3], y, i32(count)),  # * x
        ]

    def gelu(self, x, y, count: int):
        """Div(sqrt 2) -> Erf -> Add 1 -> Mul 0.5 -> Mul x (the opset-18 export)."""
        return self._gelu_chain("gelu", x, y, count, 0)

    def geglu(self, x, y, rows: int, d: int):
        """Split (two slices) -> GELU chain on the gate -> Mul hidden."""
        tag = "geglu"
        count = rows * d
        hidden, gate, g = (self.temp(tag, i, 4 * count) for i in range(3))
        ev = [self.ew("un_slice_last", count, x, hidden, i32(rows), i32(2 * d), i32(0), i32(d)),
              self.ew("un_slice_last", count, x, gate, i32(rows), i32(2 * d), i32(d), i32(d))]
        ev += self._gelu_chain(tag, gate, g, count, 3)
        ev.append(self.ew("un_mul", count, hidden, g, y, i32(count)))
        return ev

    # ------------------------------------------------------------------ attention
    def attention(self, q, k, v, o, n: int, lq: int, lk: int, heads: int, dk: int, dv: int, scale: float):
        """As the backend runs the unfused graph: BATCH_MATMUL S = q k^T (the full [N,H,Lq,Lk]
        tensor; gemm.cl with the backend's tile), SOFTMAX(beta = scale) -> P, BATCH_MATMUL P v
        -> [N,H,Lq,Dv], TRANSPOSE to [N,Lq,H*Dv]. (The graph's q/k/v TRANSPOSEs are strides here.)"""
        tag = "attention"
        sbytes = 4 * n * heads * lq * lk
        s, p = self.temp(tag, 0, sbytes), self.temp(tag, 1, sbytes)
        hs = lq * lk
        e1 = self.r.gemm(q, k, s, lq, lk, dk, a_sm=heads * dk, a_sk=1, b_sk=1, b_sn=heads * dk, ldc=lk,
                         bdims=(n, heads), a_bs=(lq * heads * dk, dk), b_bs=(lk * heads * dk, dk), c_bs=hs)
        e2 = self.r.launch(self.k("un_softmax_rows"), (WG * n * heads * lq,), (WG,), s, p, i32(lk), f32(scale))
        t = self.temp(tag, 2, 4 * n * heads * lq * dv)  # [N, H, Lq, Dv]
        e3 = self.r.gemm(p, v, t, lq, dv, lk, a_sm=lk, a_sk=1, b_sk=heads * dv, b_sn=1, ldc=dv,
                         bdims=(n, heads), a_bs=(heads * hs, hs), b_bs=(lk * heads * dv, dv), c_bs=lq * dv)
        total = n * lq * heads * dv
        e4 = self.r.launch(self.k("un_heads_to_rows"), (round_up(total, WG),), (WG,), t, o, i32(lq), i32(heads),
                           i32(dv), i32(total))
        return [*e1, e2, *e3, e4]
