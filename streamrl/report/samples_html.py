"""RUN_DIR/report/samples.html: the kept samples (RUN_DIR/samples.jsonl) as one readable page, by step.

write_samples_html(read_samples(run_dir), out / "samples.html")   # streamrl report does this
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from streamrl.train.samples import header_parts

STYLE = """body{font-family:sans-serif;max-width:70em;margin:1em auto;padding:0 1em}
.s{border:1px solid #ccc;border-radius:4px;margin:.6em 0;padding:.4em .8em}
.h{color:#444;font-size:90%}pre{white-space:pre-wrap;background:#f6f6f6;padding:.4em;margin:.3em 0}
.env pre{background:#eef4ff}.prompt pre{background:#fff8e6}"""


def _block(label: str, text: str, cls: str) -> str:
    return f'<div class="{cls}"><b>{escape(label)}</b><pre>{escape(text)}</pre></div>'


def sample_html(row: dict) -> str:
    head = " &middot; ".join(escape(part) for part in header_parts(row))
    body = [_block("prompt", row["prompt"], "prompt")]
    if row.get("turns"):
        body += [_block(t["role"], t["text"], t["role"]) for t in row["turns"]]
    else:
        body.append(_block("completion", row["completion"], "model"))
    body += [_block(f"{key} said", text, "env") for key, text in row.get("annotation_texts", {}).items()]
    return f'<div class="s"><div class="h">{head}</div>{"".join(body)}</div>'


def samples_page(rows: list[dict], title: str) -> str:
    steps: dict[int, list[dict]] = {}
    for r in rows:
        steps.setdefault(int(r["step"]), []).append(r)
    sections = [f'<h2 id="step-{s}">step {s}</h2>' + "".join(sample_html(r) for r in steps[s]) for s in sorted(steps)]
    empty = "<p>No samples (metrics.samples_per_step is 0, or no step trained yet).</p>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>{''.join(sections) or empty}</body></html>"
    )


def write_samples_html(rows: list[dict], path: Path, title: str = "samples") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(samples_page(rows, title))
    return path
