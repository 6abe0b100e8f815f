"""How ``rayfleet sim calibrate`` shows a fit: measured against fitted, row by row."""

from __future__ import annotations

from rich.table import Table

from rayfleet.sim.calibrate import Fit


def fit_table(fit: Fit) -> Table:
    table = Table(
        title=(
            f"step = {fit.step_s * 1e3:.3f} ms + {fit.prefill_token_s * 1e6:.3f} us/prefill token"
            f" + {fit.decode_seq_s * 1e6:.1f} us/decode seq; request overhead "
            f"{fit.request_overhead_s * 1e3:.3f} ms; "
            f"mean abs relative error {fit.mean_abs_rel_error:.1%}"
        )
    )
    for column in ("kind", "prefill tokens", "decode seqs", "measured ms", "fitted ms", "error"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for o in fit.observations:
        table.add_row(
            o.kind,
            str(o.num_prefill_tokens),
            str(o.num_decode_seqs),
            f"{o.measured_s * 1e3:.2f}",
            f"{o.fitted_s * 1e3:.2f}",
            f"{(o.fitted_s - o.measured_s) / o.measured_s:+.1%}",
        )
    return table
