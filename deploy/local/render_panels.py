#!/usr/bin/python3
"""Renders the LazyKV Grafana dashboards to PNG without Grafana: every panel's PromQL is
run through Prometheus's HTTP API (/api/v1/query_range) and drawn with matplotlib where
the panel sits on Grafana's 24-column grid (one image per dashboard; collapsed rows are
drawn expanded).

    /usr/bin/python3 deploy/local/render_panels.py [--prometheus URL] [--minutes N]
        [--rate-interval 30s] [--out deploy/grafana/screenshots] [--dashboards DIR]

Run it while deploy/local/run.sh's Prometheus holds data (run.sh --then runs it at the end
of its load). Variables: $job and $instance are "All" (.*), $__rate_interval is
--rate-interval, $__range the rendered range. Without --minutes, the range starts at the
first sample of `up` in the last hour.
"""
import argparse
import glob
import json
import math
import os
import re
import sys
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from datetime import datetime  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BG, PANEL_BG, FG, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0",
          "#37872d", "#fade2a", "#c4162a", "#1f60c4"]
THRESHOLD_COLORS = {"green": "#73bf69", "red": "#f2495c", "orange": "#ff9830", "yellow": "#fade2a",
                    "blue": "#5794f2"}


def query_range(base, expr, start, end, step):
    data = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step}).encode()
    req = urllib.request.Request(base.rstrip("/") + "/api/v1/query_range", data=data)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    if body.get("status") != "success":
        raise RuntimeError(body.get("error", "query failed"))
    return body["data"]["result"]


def substitute(expr, values):
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), ".*"), expr)


def resolve_variables(dashboard, base, start, end, rate_interval):
    """Grafana's values for the dashboard's variables, each query variable set to "All":
    the alternation of the label values its label_values() query finds (as Grafana's
    Prometheus data source writes a multi-value "All", regex-escaped)."""
    values = {"__rate_interval": rate_interval, "__interval": "15s", "__range": f"{int(end - start)}s",
              "__range_s": str(int(end - start)), "datasource": "Prometheus"}
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.match(r"label_values\((.*),\s*(\w+)\s*\)$", q.strip(), re.S)
        if not m:
            values[v["name"]] = ".*"
            continue
        selector, label = substitute(m.group(1), values), m.group(2)
        url = base.rstrip("/") + "/api/v1/series?" + urllib.parse.urlencode(
            {"match[]": selector, "start": start, "end": end})
        with urllib.request.urlopen(url, timeout=30) as r:
            found = sorted({s[label] for s in json.load(r)["data"] if label in s})
        escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", x) for x in found]
        values[v["name"]] = "(" + "|".join(escaped) + ")" if escaped else "$^"
        values["__text_" + v["name"]] = ", ".join(found) or "none"
    return values


def legend(fmt, metric, expr):
    if fmt and fmt != "__auto":
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip()
    labels = {k: v for k, v in metric.items() if k not in ("job", "instance", "__name__")}
    return ", ".join(f"{k}={v}" for k, v in labels.items()) or expr[:40]


def human(v, unit):
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "-"
    if unit == "percentunit":
        return f"{v * 100:.1f}%"
    if unit == "s":
        if v == 0:
            return "0 s"
        if abs(v) < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if abs(v) < 1:
            return f"{v * 1e3:.3g} ms"
        return f"{v:.3g} s"
    if unit in ("bytes", "Bps"):
        suffix = "/s" if unit == "Bps" else ""
        for u in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024 or u == "TiB":
                return f"{v:.3g} {u}{suffix}"
            v /= 1024
    if unit == "reqps":
        return f"{v:.3g} req/s"
    if unit == "ops":
        return f"{v:.3g}/s"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def threshold_color(v, steps):
    color = "green"
    for s in steps or []:
        if s.get("value") is None or (v is not None and not math.isnan(v) and v >= s["value"]):
            color = s["color"]
    return THRESHOLD_COLORS.get(color, color)


def series_of(panel, base, start, end, step, values):
    out, errors = [], []
    for t in panel.get("targets", []):
        expr = substitute(t["expr"], values)
        try:
            for r in query_range(base, expr, start, end, step):
                xs = [datetime.fromtimestamp(float(ts)) for ts, _ in r["values"]]
                ys = [float(v) for _, v in r["values"]]
                out.append((legend(t.get("legendFormat"), r["metric"], t["expr"]), xs, ys))
        except Exception as e:  # noqa: BLE001 - drawn into the panel
            errors.append(f"{t.get('refId')}: {e}")
    return out, errors


def right_axis_series(panel):
    """{series name: unit} of the overrides that put a series on a right axis."""
    out = {}
    for o in panel.get("fieldConfig", {}).get("overrides", []):
        props = {p["id"]: p["value"] for p in o.get("properties", [])}
        if props.get("custom.axisPlacement") == "right":
            out[o["matcher"]["options"]] = props.get("unit", "short")
    return out


def style_axis(ax, unit):
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: human(v, unit)))
    ax.tick_params(colors=FG, labelsize=6.5)
    for s in ax.spines.values():
        s.set_color(GRID)


def draw_timeseries(ax, panel, series, unit, xlim):
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    right = right_axis_series(panel)
    right_series = [s for s in series if s[0] in right]
    series = [s for s in series if s[0] not in right]
    handles = []
    if stacked and series:
        # Align on the union of timestamps (missing points count as 0).
        times = sorted({x for _, xs, _ in series for x in xs})
        index = {t: i for i, t in enumerate(times)}
        bottom = [0.0] * len(times)
        for i, (name, xs, ys) in enumerate(series):
            full = [0.0] * len(times)
            for x, y in zip(xs, ys):
                full[index[x]] = 0.0 if math.isnan(y) else y
            top = [b + v for b, v in zip(bottom, full)]
            color = COLORS[i % len(COLORS)]
            ax.fill_between(times, bottom, top, color=color, alpha=0.35, linewidth=0)
            handles += ax.plot(times, top, color=color, linewidth=1, label=name)
            bottom = top
    else:
        for i, (name, xs, ys) in enumerate(series):
            handles += ax.plot(xs, ys, color=COLORS[i % len(COLORS)], linewidth=1.2, label=name)
    if right_series:
        ax2 = ax.twinx()
        for j, (name, xs, ys) in enumerate(right_series):
            handles += ax2.plot(xs, ys, color=COLORS[(len(series) + j) % len(COLORS)], linewidth=1,
                                linestyle="--", label=name + " (right)")
        style_axis(ax2, right[right_series[0][0]])
        lo, hi = ax2.get_ylim()
        ax2.set_ylim(0, max(hi, 1e-9) * 1.05)
    style_axis(ax, unit)
    ax.set_xlim(*xlim)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
    span_min = (xlim[1] - xlim[0]).total_seconds() / 60
    ax.xaxis.set_major_locator(mdates.MinuteLocator(interval=max(1, int(span_min // 6)), byminute=None))
    d = panel.get("fieldConfig", {}).get("defaults", {})
    lo, hi = ax.get_ylim()
    if d.get("min") is not None:
        lo = d["min"]
    if d.get("max") is not None and (not series or hi <= d["max"] * 1.05):
        hi = d["max"]
    if hi <= lo:
        hi = lo + 1
    ax.set_ylim(lo, hi * (1.0 if d.get("max") is not None else 1.05))
    ax.grid(color=GRID, linewidth=0.5)
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, -0.07), fontsize=6.5, frameon=False,
                  labelcolor=FG, ncol=legend_columns(panel), handlelength=1.2, borderaxespad=0, columnspacing=1.2)


def legend_columns(panel):
    return max(1, panel["gridPos"]["w"] // 4)


def legend_rows(panel, n):
    return math.ceil(n / legend_columns(panel)) if n else 0


def draw_stat(ax, panel, series, unit, xlim):
    d = panel.get("fieldConfig", {}).get("defaults", {})
    value = None
    if series:
        _, xs, ys = series[0]
        vals = [y for y in ys if not math.isnan(y)]
        value = vals[-1] if vals else None
        ax.fill_between(xs, ys, color=threshold_color(value, d.get("thresholds", {}).get("steps")), alpha=0.2,
                        linewidth=0)
    ax.set_xlim(*xlim)
    ax.set_xticks([])
    ax.set_yticks([])
    for s in ax.spines.values():
        s.set_visible(False)
    text = human(value, unit) if value is not None else "No data"
    color = threshold_color(value, d.get("thresholds", {}).get("steps")) if value is not None else FG
    ax.text(0.5, 0.45, text, transform=ax.transAxes, ha="center", va="center", fontsize=17, color=color,
            fontweight="bold")


def render(dashboard, base, start, end, step, rate_interval, out_path):
    values = resolve_variables(dashboard, base, start, end, rate_interval)
    xlim = (datetime.fromtimestamp(start), datetime.fromtimestamp(end))
    panels = []
    for p in dashboard["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []) or [])
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    px_w, unit_h, dpi = 1600, 30, 80
    header = 60
    fig_h = (bottom * unit_h + header) / dpi
    fig = plt.figure(figsize=(px_w / dpi, fig_h), dpi=dpi, facecolor=BG)
    H = bottom * unit_h + header
    fig.text(0.01, 1 - 22 / H, dashboard["title"], color=FG, fontsize=15, fontweight="bold", va="center")
    fig.text(0.01, 1 - 45 / H,
             f"{datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(end):%H:%M:%S}, "
             f"step {step}s, $__rate_interval={rate_interval}, job=All ({values.get('__text_job', '-')}), "
             f"instance=All ({values.get('__text_instance', '-')}); drawn from Prometheus by "
             f"deploy/local/render_panels.py, not Grafana", color="#8e8e8e", fontsize=8, va="center")
    empty = 0
    for p in panels:
        g = p["gridPos"]
        x0, w = g["x"] / 24, g["w"] / 24
        top_px = header + g["y"] * unit_h
        if p["type"] == "row":
            fig.text(x0 + 0.005, 1 - (top_px + unit_h / 2) / H,
                     p["title"] + ("  (collapsed in Grafana)" if p.get("collapsed") else ""),
                     color=FG, fontsize=11, fontweight="bold", va="center")
            continue
        pad = 6
        left = x0 + pad / px_w
        width = w - 2 * pad / px_w
        series, errors = series_of(p, base, start, end, step, values)
        right = right_axis_series(p)
        ax_top = top_px + 22       # room for the title
        if p["type"] == "stat":
            ax_bottom = top_px + g["h"] * unit_h - 8
        else:                      # room for the time axis and the legend under it
            ax_bottom = top_px + g["h"] * unit_h - 24 - 11 * legend_rows(p, len(series))
        ax = fig.add_axes([left + (0 if p["type"] == "stat" else 48 / px_w), 1 - ax_bottom / H,
                           width - (0 if p["type"] == "stat" else (56 + (48 if right else 0)) / px_w),
                           (ax_bottom - ax_top) / H])
        ax.set_facecolor(PANEL_BG)
        bg = plt.Rectangle((left, 1 - (top_px + g["h"] * unit_h - 3) / H), width, (g["h"] * unit_h - 6) / H,
                           transform=fig.transFigure, facecolor=PANEL_BG, edgecolor=GRID, linewidth=0.6, zorder=-1)
        fig.patches.append(bg)
        fig.text(left + 6 / px_w, 1 - (top_px + 13) / H, p["title"], color=FG, fontsize=9, va="center")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if p["type"] == "stat":
            draw_stat(ax, p, series, unit, xlim)
        else:
            draw_timeseries(ax, p, series, unit, xlim)
            if not series:
                ax.text(0.5, 0.5, "No data", transform=ax.transAxes, ha="center", va="center", color="#8e8e8e")
        if errors:
            ax.text(0.02, 0.05, "\n".join(errors)[:200], transform=ax.transAxes, color="#f2495c", fontsize=6)
        if not series:
            empty += 1
    fig.savefig(out_path, dpi=dpi, facecolor=BG)
    plt.close(fig)
    try:  # a 256-colour palette keeps each image well under 300 KB
        from PIL import Image
        with Image.open(out_path) as im:
            im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out_path, optimize=True)
    except ImportError:
        pass
    return sum(1 for p in panels if p["type"] != "row"), empty


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", "http://127.0.0.1:9090"))
    ap.add_argument("--dashboards", default=os.path.join(ROOT, "deploy/grafana/dashboards"))
    ap.add_argument("--out", default=os.path.join(ROOT, "deploy/grafana/screenshots"))
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--rate-interval", default="30s")
    ap.add_argument("--step", type=int, default=0, help="seconds (default: range/240, at least 5)")
    args = ap.parse_args()

    end = time.time()
    if args.minutes:
        start = end - args.minutes * 60
    else:
        r = query_range(args.prometheus, "count(up)", end - 3600, end, 5)
        if not r:
            print(f"no data in {args.prometheus} (is Prometheus scraping?)", file=sys.stderr)
            return 1
        start = float(r[0]["values"][0][0])
    step = args.step or max(5, int((end - start) / 240))
    os.makedirs(args.out, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(args.dashboards, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        out = os.path.join(args.out, os.path.basename(path)[:-5] + ".png")
        n, empty = render(d, args.prometheus, start, end, step, args.rate_interval, out)
        print(f"{os.path.relpath(out, ROOT)}: {n} panels, {empty} without data, {os.path.getsize(out) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
