"""A CUDA default generator without a GPU: torch's Philox state protocol over a CPU generator.

Why: a real ``torch.cuda.default_generators[i]`` is a Philox generator whose ``get_state()`` is 16 bytes — a
uint64 seed and a uint64 offset — and code above torch reads and writes those fields. DTensor's
``OffsetBasedRNGTracker`` (every random op on a DTensor, e.g. torchtitan's ``init_weights`` after
``parallelize_llama``) wraps the state in ``_PhiloxState``, moves the offset so that each shard draws its own
stream, and sets it back; a CPU generator's 5,056-byte Mersenne-Twister state fails its size check
(``AssertionError`` in ``_PhiloxState.offset``). So the capture's per-device generators keep the Philox view:
``get_state``/``set_state``/``get_offset``/``set_offset``/``manual_seed``/``seed``/``initial_seed`` behave as
torch's CUDA generator's do, and the numbers come from the CPU generator underneath (it *is* a
``torch.Generator``, so a random op can draw from it), reseeded from (seed, offset) whenever the state is set
or a draw moves the offset.

Not torch's: the values drawn (a CPU generator, not Philox), and how far one random op moves the offset
(``advance``: the element count rounded up to 4, one Philox counter step per four values; real CUDA's step
also depends on the launch grid, which no CPU can know). Code that only round-trips the state, or sets the
offset itself as DTensor does, sees exactly torch's behaviour.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_STATE_BYTES = 16  # torch's CUDA generator state: seed (uint64) then offset (uint64), little-endian
_U64 = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # golden-ratio increment: distinct (seed, offset) pairs give distinct CPU seeds


class PhiloxStateGenerator(torch.Generator):
    """One fake device's default generator: a ``torch.Generator`` showing the Philox (seed, offset) state."""

    def __init__(self) -> None:
        super().__init__()
        self._seed = super().initial_seed()
        self._offset = 0

    # -- the Philox view ------------------------------------------------------------------------------------
    def get_state(self) -> torch.Tensor:
        packed = self._seed.to_bytes(8, "little") + self._offset.to_bytes(8, "little")
        return torch.frombuffer(bytearray(packed), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> PhiloxStateGenerator:
        if new_state.dtype != torch.uint8 or new_state.numel() != _STATE_BYTES:
            # torch's CUDA generator refuses other states with this message
            raise RuntimeError(f"RNG state is wrong size: expected {_STATE_BYTES} bytes, got {new_state.numel()}")
        packed = bytes(new_state.contiguous().cpu().tolist())
        self._reset(int.from_bytes(packed[:8], "little"), int.from_bytes(packed[8:], "little"))
        return self

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> PhiloxStateGenerator:
        self._reset(self._seed, int(offset))
        return self

    def manual_seed(self, seed: int) -> PhiloxStateGenerator:
        self._reset(int(seed) & _U64, 0)
        return self

    def seed(self) -> int:
        self._reset(super().seed(), 0)
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    # -- what the capture's placement calls after a random op drew from this generator ----------------------
    def advance(self, values: int) -> None:
        """Move the offset past ``values`` numbers drawn, and draw the next ones from the new (seed, offset):
        as with Philox, what is drawn is a function of the state alone, so a saved state restored draws again
        exactly what followed it."""
        self._reset(self._seed, self._offset + (max(values, 0) + 3) // 4 * 4)

    def advance_past(self, drawn: Iterable[torch.Tensor]) -> None:
        """``advance`` past every value of the tensors a random op drew into."""
        self.advance(sum(tensor.numel() for tensor in drawn))

    def _reset(self, seed: int, offset: int) -> None:
        self._seed, self._offset = seed & _U64, offset & _U64
        super().manual_seed((self._seed * _MIX + self._offset) & _U64)
