#!/usr/bin/env python3
"""Reference values for volt's GradScaler in DeepSpeed's mode (tests/precision/grad_scaler_test.cpp).

A model of DeepSpeed's fp16 DynamicLossScaler.update_scale, written from its documented
behaviour (deepspeed/runtime/fp16/loss_scaler.py): on a step whose gradients overflow, the
hysteresis counter is spent first (the step is skipped, the scale kept); when it is down to one,
the scale is divided by the factor, not below min_scale, and an overflow with the scale already
at min_scale raises. A finite step refills the hysteresis (always with consecutive_hysteresis,
else only when the scale grows), and the scale is multiplied by the factor every scale_window
iterations counted from the last overflow. Prints, per pattern, the scale after each step.

Usage: python3 tools/deepspeed_loss_scale_reference.py
"""


class Model:
    def __init__(self, init, window, hysteresis, min_scale, consecutive):
        self.scale = init
        self.window = window
        self.hysteresis = hysteresis
        self.left = hysteresis
        self.min_scale = min_scale
        self.consecutive = consecutive
        self.iteration = 0
        self.last_overflow = -1

    def update(self, overflow):
        if overflow:
            if self.hysteresis == 1 or self.left == 1:
                if self.scale == self.min_scale:
                    raise RuntimeError("at the minimum scale")
                self.scale = max(self.scale / 2.0, self.min_scale)
            else:
                self.left -= 1
            self.last_overflow = self.iteration
        else:
            if self.consecutive:
                self.left = self.hysteresis
            if (self.iteration - self.last_overflow) % self.window == 0:
                if not self.consecutive:
                    self.left = self.hysteresis
                self.scale *= 2.0
        self.iteration += 1


CASES = [
    # (name, init, window, hysteresis, min_scale, consecutive, pattern: O overflow, G finite)
    ("hysteresis", 16.0, 3, 2, 1.0, False, "OOGGGOGOOGGGOGO"),
    ("consecutive", 16.0, 3, 2, 1.0, True, "OOGGGOGOOGGGOGO"),
    ("floor", 4.0, 4, 1, 1.0, False, "OOGOO"),
]

if __name__ == "__main__":
    for name, init, window, hysteresis, min_scale, consecutive, pattern in CASES:
        m = Model(init, window, hysteresis, min_scale, consecutive)
        scales = []
        for c in pattern:
            try:
                m.update(c == "O")
            except RuntimeError:
                scales.append("raise")
                break
            scales.append(m.scale)
        print(name, pattern, ", ".join(str(s) for s in scales))
