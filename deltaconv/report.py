"""The conversion report: what became of every node of the traced graph (data, not prints)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: statuses a node can have
STATUSES = ("input", "converted", "fallback", "folded", "removed", "static", "shape", "output", "dense")


@dataclass
class NodeReport:
    """One traced node: its fx name, what it called, the DC layer it became (if any)."""

    node: str
    target: str
    status: str
    layer: str = ""
    dc_class: str = ""
    note: str = ""


@dataclass
class ConversionReport:
    """Every node of the traced model and what the converter made of it.

    ``status``: ``converted`` (a DC layer with a delta rule), ``fallback`` (runs dense on
    accumulated inputs), ``folded`` (BatchNorm folded into the preceding conv), ``removed``
    (Identity/Dropout in eval), ``static`` (does not depend on the input frames), ``shape``
    (reads only shapes), ``input``/``output`` (sparsifier/densifier inserted), ``dense`` (an
    upsampling of the output that runs dense after the densifier, ``convert(fuse=True)``).
    """

    nodes: list[NodeReport] = field(default_factory=list)

    @property
    def fallbacks(self) -> list[NodeReport]:
        """Nodes without a delta rule (run dense on accumulated inputs)."""
        return [n for n in self.nodes if n.status == "fallback"]

    @property
    def converted(self) -> list[NodeReport]:
        """Nodes replaced by a delta layer."""
        return [n for n in self.nodes if n.status == "converted"]

    @property
    def fused(self) -> list[NodeReport]:
        """Nodes whose layer runs fused with another (``convert(fuse=True)``: a residual add and the
        activation after it; the note names the partner)."""
        return [n for n in self.nodes if "fused with " in n.note]

    @property
    def recomputing(self) -> list[NodeReport]:
        """Convolutions that recompute their whole output for the activation after them (directly, or
        through a residual add fused with it: "output kept, summed by"), and those activations
        (``convert(recompute=True)``, value mode; the note names the partner)."""
        return [n for n in self.nodes if "recomputes for " in n.note or "recomputed by " in n.note]

    def counts(self) -> dict[str, int]:
        """Number of nodes per status."""
        return dict(Counter(n.status for n in self.nodes))

    def as_dicts(self) -> list[dict]:
        """One plain dict per node (its fields), for JSON or a DataFrame."""
        return [vars(n).copy() for n in self.nodes]

    def __str__(self) -> str:
        rows = [("node", "target", "status", "layer", "class")]
        rows += [(n.node, n.target, n.status + (f" ({n.note})" if n.note else ""), n.layer, n.dc_class)
                 for n in self.nodes]
        widths = [min(max(len(r[i]) for r in rows), 48) for i in range(5)]
        lines = ["  ".join(c[:w].ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items()))
        lines.append(f"{len(self.nodes)} nodes: {counts}")
        if self.fallbacks:
            lines.append("fallbacks: " + ", ".join(f"{n.node} ({n.target})" for n in self.fallbacks))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ConversionReport({self.counts()})"
