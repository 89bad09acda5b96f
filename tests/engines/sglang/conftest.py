"""The SGLang suite runs in SGLang 0.5.23's environment on a CPU torch (lock.txt)."""

from __future__ import annotations

import torch

# PyPI's torchvision is a CUDA build. Beside a CPU torch its compiled ops cannot load, and its
# meta registrations then fail on import ("operator torchvision::nms does not exist"). SGLang's
# model configs import torchvision.transforms, so every SGLang import needs these two op
# schemas defined first. A torchvision that loaded its own ops is left alone.
try:
    torch.ops.torchvision.nms  # noqa: B018 - raises when the op is missing
except (AttributeError, RuntimeError):
    _TORCHVISION = torch.library.Library("torchvision", "DEF")
    _TORCHVISION.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
