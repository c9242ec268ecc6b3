"""A run's training-curves figure, drawn by the delivery process while the training process logs
the run's models (tracking.lifecycle.record_end): `Curves`, what one figure needs, handed over as
a file beside the picture.

Why there: a figure is about 0.1 s of Agg drawing and PNG encoding that holds the GIL (two threads
drew eight figures no faster than one, docs/performance.md), once per run and per member of a pack;
at a run's end the training process is busy with the models (one core) while the delivery process,
already running, waits for rows. The same code draws it in either process (`Curves.draw`, which
calls seqlab.plots.training_curves), so a picture is the same wherever it was drawn, and the training
process draws it itself where the helper cannot (gone, or slower than `WAIT_S`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

# How long the training process waits for the helper's figure before it draws its own: far above
# a figure's 0.1-0.2 s, for a helper at its lower priority on a machine that other jobs keep busy.
WAIT_S = 20.0


@dataclass
class Curves:
    """One training-curves figure to draw: its series (a JSON file written by the training process,
    removed once drawn), the PNG it becomes, and its title."""

    series: Path
    png: Path
    title: str

    @classmethod
    def write(
        cls, series: Mapping[str, Sequence[Sequence[float]]], png: Path, title: str
    ) -> "Curves":
        """The figure's series (name -> [[step, value], ...], as plots.series_to_draw gives them)
        into a file beside `png`. JSON keeps every float as it was (NaN and infinities included)."""
        path = png.with_name(f".{png.stem}.series.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({k: [list(p) for p in v] for k, v in series.items()}))
        return cls(path, png, title)

    def message(self) -> dict[str, str]:
        return {"series": str(self.series), "png": str(self.png), "title": self.title}

    @classmethod
    def of(cls, message: Mapping[str, Any]) -> "Curves":
        return cls(Path(message["series"]), Path(message["png"]), str(message["title"]))

    def draw(self) -> Path:
        """The figure drawn into a file of its own, then moved onto `png` at once: the training
        process and the helper may both draw it (a late helper), and an upload reads whole files."""
        from seqlab.plots import training_curves  # Matplotlib: the helper starts without it

        history = {k: [tuple(p) for p in v] for k, v in json.loads(self.series.read_text()).items()}
        drawing = self.png.with_name(f".{self.png.stem}.{os.getpid()}.png")
        training_curves(history, drawing, self.title)
        os.replace(drawing, self.png)
        return self.png

    def discard(self) -> None:
        self.series.unlink(missing_ok=True)


@dataclass
class DrawnHere:
    """A figure this process draws itself, when waited for (no delivery process to ask)."""

    curves: Curves

    def wait(self) -> Path:
        try:
            return self.curves.draw()
        finally:
            self.curves.discard()
