"""Panel and query building helpers for deploy/grafana/build_dashboards.py.

PromQL fragments (label matchers, rates, ratios guarded by "> 0", histogram quantiles),
query targets, stat and time-series panels, rows, template variables, the 24-column grid
layout and the dashboard envelope. The dashboards themselves are in build_dashboards.py.
"""

DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"


def F(extra=""):
    """Label matchers: extra ones first, then the job and instance variables."""
    m = 'job=~"$job", instance=~"$instance"'
    return "{" + (extra + ", " if extra else "") + m + "}"


def rate(metric, extra="", by=None):
    r = f"rate({metric}{F(extra)}[{RI}])"
    return f"sum by ({by}) ({r})" if by else f"sum({r})"


def ratio(num, den):
    return f"{num}\n  / ({den} > 0)"


def quantile(q, hist, by="", extra=""):
    by = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({by}) (rate({hist}_bucket{F(extra)}[{RI}])))"


def target(expr, legend="", ref="A", instant=False):
    t = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto", "range": True}
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


def targets(*pairs):
    return [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(pairs)]


def thresholds(*steps):
    """steps: (color, value) with the first value None."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def stat(title, expr, unit, desc, steps=(("green", None),), w=3, h=4, decimals=None, legend=""):
    p = {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "w": w,
        "h": h,
        "targets": [target(expr, legend)],
        "fieldConfig": {
            "defaults": {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": thresholds(*steps)},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        },
    }
    if decimals is not None:
        p["fieldConfig"]["defaults"]["decimals"] = decimals
    return p


def ts(title, tgts, unit, desc, w=8, h=8, stack=False, percent=False, minimum=0, maximum=None, log=False):
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 25 if stack else 8,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "percent" if percent else ("normal" if stack else "none"), "group": "A"},
    }
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    defaults = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom}
    if minimum is not None and not log:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "w": w,
        "h": h,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def right_axis(series_name, unit):
    """A field override: the series named series_name on a right axis with its own unit."""
    return {
        "matcher": {"id": "byName", "options": series_name},
        "properties": [{"id": "unit", "value": unit}, {"id": "custom.axisPlacement", "value": "right"}],
    }


def row(title, panels, collapsed=False):
    return {"row": title, "collapsed": collapsed, "panels": panels}


def variables(job_query):
    # label_values(SELECTOR, job) -> label_values(SELECTOR restricted to $job, instance)
    selector = job_query[len("label_values("):job_query.rindex(",")]
    if selector.endswith("}"):
        selector = selector[:-1] + ', job=~"$job"}'
    else:
        selector += '{job=~"$job"}'
    inst_query = f"label_values({selector}, instance)"
    return [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {"selected": False, "text": "Prometheus", "value": "Prometheus"},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        },
        _query_var("job", job_query),
        _query_var("instance", inst_query),
    ]


def _query_var(name, query):
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DS,
        "query": query,
        "definition": query,
        "refresh": 2,
        "multi": True,
        # "All" is the alternation of the values found (no allValue): ".*" would let the
        # cache-server dashboard's $job match the workers' job too.
        "includeAll": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "sort": 1,
        "hide": 0,
        "regex": "",
    }


def layout(rows):
    """Places rows and panels on Grafana's 24-column grid and numbers every panel."""
    panels, next_id, y = [], 1, 0
    for r in rows:
        row_panel = {
            "type": "row",
            "id": next_id,
            "title": r["row"],
            "collapsed": r["collapsed"],
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "panels": [],
        }
        next_id += 1
        y += 1
        panels.append(row_panel)
        x, row_h = 0, 0
        for p in r["panels"]:
            w, h = p.pop("w"), p.pop("h")
            if x + w > 24:
                x, y = 0, y + row_h
                row_h = 0
            p = {"id": next_id, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **p}
            next_id += 1
            x += w
            row_h = max(row_h, h)
            (row_panel["panels"] if r["collapsed"] else panels).append(p)
        y += row_h
    return panels


def dashboard(uid, title, desc, job_query, rows):
    return {
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["lazykv"],
        "editable": True,
        "graphTooltip": 1,
        "id": None,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [{"type": "dashboards", "tags": ["lazykv"], "asDropdown": False, "title": "LazyKV", "includeVars": True, "keepTime": True}],
        "templating": {"list": variables(job_query)},
        "panels": layout(rows),
    }


def latency_quantiles(hist, title, desc, w=8):
    return ts(
        title,
        targets(
            (quantile(0.5, hist), "p50"),
            (quantile(0.9, hist), "p90"),
            (quantile(0.99, hist), "p99"),
        ),
        "s",
        desc,
        w=w,
    )
