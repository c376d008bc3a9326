#!/usr/bin/python3
"""Checks the LazyKV Grafana dashboards and Prometheus rules against each other and
against real /metrics scrapes.

    /usr/bin/python3 scripts/check_dashboards.py [--scrape FILE ...] [--dashboards DIR]
                                                 [--rules FILE ...] [--promtool PATH]

(a) every dashboard (deploy/grafana/dashboards/*.json) is valid JSON with unique panel ids,
    also inside collapsed rows; every query target has an expression and a unique refId;
    dashboard uids are unique;
(b) every PromQL expression of every panel target (and the selectors of the template
    variables' label_values() queries) parses: each becomes one recording rule in a
    temporary rules file, with Grafana's variables replaced by plausible values, and
    `promtool check rules` must accept the file; every division must be guarded against a
    zero denominator ("/ (... > 0)" or "clamp_min");
(c) with --scrape (saved /metrics pages, e.g. deploy/local/scrapes/*.prom, made by
    deploy/local/capture_scrapes.sh): every metric name used by a panel, a variable or a
    rule (deploy/prometheus/rules/*.yml) exists in some scrape. A family counts when its
    "# TYPE" line or a sample is there; a histogram is its _bucket, _sum and _count series
    (its bare name is not a series); the rules' record names count as existing, as do
    Prometheus's own series (up, scrape_*, ALERTS). Label names in matchers must exist on
    the family; a label value not seen is only a note (labelled series such as
    rejected{reason=...} appear after their first event).
Prints per-dashboard results; exits 1 on any failure, 2 on a usage problem.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Grafana's variables, replaced by values that keep the expression's shape.
VARIABLE_VALUES = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__interval_ms": "30000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "job": "lazykv-worker",
    "instance": "127.0.0.1:9400",
}
PROMETHEUS_OWN = {
    "up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
    "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE",
}
# Labels Prometheus attaches (target labels) or that are part of a histogram series.
IMPLICIT_LABELS = {"job", "instance", "__name__", "le", "quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
            "unless", "inf", "nan"}
STRING_RE = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'


def substitute(expr):
    def repl(m):
        name = m.group(1) or m.group(2)
        return VARIABLE_VALUES.get(name, "x")
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def metric_names(expr):
    """Metric names an expression selects (a tokenizer, not a full PromQL parser: promtool
    has checked the syntax)."""
    names = set()
    for op, value in re.findall(r'__name__\s*(=~|=)\s*"([^"]*)"', expr):
        names |= set(value.split("|")) if op == "=~" else {value}
    s = re.sub(STRING_RE, '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\b(group_left|group_right)\b", " ", s)
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    s = re.sub(r"(?<![\w:.])(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[a-zA-Z]*", " ", s)
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        token = m.group(0)
        if re.match(r"\s*\(", s[m.end():]):
            continue  # a function or an aggregation
        if token.lower() in KEYWORDS:
            continue
        names.add(token)
    return names


def matchers(expr):
    """(metric, label, op, value) for every label matcher written after a metric name."""
    out = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}", expr):
        metric = m.group(1)
        if not metric or metric in KEYWORDS:
            continue
        for label, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"', m.group(2)):
            out.append((metric, label, op, value))
    return out


def unguarded_division(expr):
    """True when the expression divides and guards no denominator."""
    s = re.sub(STRING_RE, '""', expr)
    s = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", s)
    if "/" not in s:
        return False
    return not (re.search(r">\s*0\s*\)", s) or "clamp_min" in s)


def panels_of(dashboard):
    """Every panel, rows' nested panels included."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []) or [])
    return out


def variable_exprs(dashboard):
    """PromQL inside the template variables' queries."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        q = (q or "").strip()
        m = re.match(r"label_values\((.*),\s*\w+\s*\)$", q, re.S)
        if m:
            out.append((f"variable ${v['name']}", m.group(1)))
            continue
        m = re.match(r"query_result\((.*)\)$", q, re.S)
        if m:
            out.append((f"variable ${v['name']}", m.group(1)))
    return out


class Scrapes:
    def __init__(self, files):
        self.files = files
        self.series = set()        # names that can be queried
        self.types = {}            # family -> type
        self.labels = {}           # queried name -> {label: set(values)}
        for path in files:
            with open(path) as f:
                for line in f:
                    line = line.strip()
                    if line.startswith("# TYPE "):
                        _, _, family, kind = line.split(None, 3)
                        self.types[family] = kind
                    elif line and not line.startswith("#"):
                        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
                        if not m:
                            continue
                        name = m.group(1)
                        self.series.add(name)
                        labels = self.labels.setdefault(name, {})
                        for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
                            labels.setdefault(k, set()).add(v)
        for family, kind in self.types.items():
            if kind == "histogram":
                self.series |= {family + "_bucket", family + "_sum", family + "_count"}
            elif kind == "summary":
                self.series |= {family, family + "_sum", family + "_count"}
            else:
                self.series.add(family)

    def family_of(self, name):
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)] if name.endswith(suffix) else None
            if base and self.types.get(base) in ("histogram", "summary"):
                return base
        return name

    def label_info(self, name):
        """{label: values} over the family's series (a histogram's from all its series)."""
        family = self.family_of(name)
        merged = {}
        for n in {name, family, family + "_bucket", family + "_sum", family + "_count"}:
            for k, vs in self.labels.get(n, {}).items():
                merged.setdefault(k, set()).update(vs)
        return merged


def load_rules(files):
    """[(where, expr)] and the set of record names."""
    exprs, records = [], set()
    for path in files:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("record") or rule.get("alert")
                exprs.append((f"{os.path.relpath(path, ROOT)}: {name}", str(rule.get("expr", ""))))
                if "record" in rule:
                    records.add(rule["record"])
    return exprs, records


def promtool_parse(promtool, items):
    """items: [(key, expr)]. Returns {key: error} for the expressions promtool refuses."""
    unique = {}
    for key, expr in items:
        unique.setdefault(expr, []).append(key)
    rules = []
    by_record = {}
    for i, (expr, keys) in enumerate(unique.items()):
        record = f"dashboard_check:expr_{i}"
        by_record[record] = keys
        rules.append({"record": record, "expr": expr})
    errors = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dashboard_exprs.rules.yml")
        with open(path, "w") as f:
            yaml.safe_dump({"groups": [{"name": "dashboard_exprs", "rules": rules}]}, f, sort_keys=False)
        proc = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            matched = False
            for line in out.splitlines():
                m = re.search(r'"(dashboard_check:expr_\d+)": (.*)', line)
                if m:
                    matched = True
                    for key in by_record.get(m.group(1), []):
                        errors[key] = m.group(2)
            if not matched:
                for key, _ in items:
                    errors[key] = "promtool check rules failed: " + out.strip().replace("\n", " | ")
    return errors, len(unique)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dashboards", default=os.path.join(ROOT, "deploy/grafana/dashboards"))
    ap.add_argument("--rules", nargs="*", default=None,
                    help="Prometheus rule files (default deploy/prometheus/rules/*.yml)")
    ap.add_argument("--scrape", nargs="*", default=[], help="saved /metrics pages")
    ap.add_argument("--promtool", default=shutil.which("promtool") or "promtool")
    args = ap.parse_args()

    if not shutil.which(args.promtool) and not os.path.exists(args.promtool):
        print(f"promtool not found ({args.promtool}); install Debian's prometheus package", file=sys.stderr)
        return 2
    rule_files = args.rules if args.rules is not None else sorted(
        glob.glob(os.path.join(ROOT, "deploy/prometheus/rules/*.yml")))
    files = sorted(glob.glob(os.path.join(args.dashboards, "*.json")))
    if not files:
        print(f"no dashboards in {args.dashboards}", file=sys.stderr)
        return 2
    for s in args.scrape:
        if not os.path.isfile(s):
            print(f"no such scrape file: {s}", file=sys.stderr)
            return 2
    scrapes = Scrapes(args.scrape) if args.scrape else None
    rule_exprs, records = load_rules(rule_files)
    known = (scrapes.series if scrapes else set()) | records | PROMETHEUS_OWN

    failed = False
    uids = {}
    reports = []   # (name, lines, ok)
    parse_items = []
    per_dash = []
    for path in files:
        name = os.path.basename(path)
        lines, ok = [], True
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            reports.append((name, [f"  FAIL invalid JSON: {e}"], False))
            per_dash.append(None)
            continue
        uid = d.get("uid")
        if uid in uids:
            lines.append(f"  FAIL uid {uid!r} also in {uids[uid]}")
            ok = False
        uids[uid] = name
        panels = panels_of(d)
        seen = {}
        for p in panels:
            pid = p.get("id")
            if pid is None:
                lines.append(f"  FAIL panel {p.get('title')!r} has no id")
                ok = False
            elif pid in seen:
                lines.append(f"  FAIL panel id {pid} used by {seen[pid]!r} and {p.get('title')!r}")
                ok = False
            else:
                seen[pid] = p.get("title")
        exprs = []
        for p in panels:
            refs = set()
            for t in p.get("targets", []) or []:
                where = f"panel {p.get('id')} {p.get('title')!r} {t.get('refId')}"
                if not (t.get("expr") or "").strip():
                    lines.append(f"  FAIL {where}: empty expr")
                    ok = False
                    continue
                if t.get("refId") in refs:
                    lines.append(f"  FAIL {where}: duplicate refId")
                    ok = False
                refs.add(t.get("refId"))
                exprs.append((where, t["expr"]))
            if p.get("targets") and "datasource" in p:
                uid_ = (p["datasource"] or {}).get("uid", "") if isinstance(p["datasource"], dict) else p["datasource"]
                if "$" not in str(uid_):
                    lines.append(f"  FAIL panel {p.get('id')} {p.get('title')!r}: data source {uid_!r} is not a variable")
                    ok = False
        exprs += variable_exprs(d)
        for where, e in exprs:
            parse_items.append(((name, where), substitute(e)))
            if unguarded_division(e):
                lines.append(f"  FAIL {where}: a division with no guard ('/ (... > 0)' or clamp_min)")
                ok = False
        n_queries = sum(1 for p in panels for _ in (p.get("targets") or []))
        lines.insert(0, f"  {len(panels)} panels ({sum(1 for p in panels if p.get('type') == 'row')} rows), "
                        f"{n_queries} queries, ids unique: {'yes' if len(seen) == len(panels) else 'NO'}")
        reports.append((name, lines, ok))
        per_dash.append(exprs)

    rules_where = "rules"
    for where, e in rule_exprs:
        parse_items.append(((rules_where, where), e))
    parse_errors, n_unique = promtool_parse(args.promtool, parse_items)

    def check_names(exprs, lines):
        ok, used, notes = True, set(), []
        for where, e in exprs:
            names = metric_names(e)
            used |= names
            if scrapes is None:
                continue
            for n in sorted(names):
                if n not in known:
                    lines.append(f"  FAIL {where}: metric {n} not in the scrapes")
                    ok = False
            for metric, label, op, value in matchers(e):
                if metric not in scrapes.series or label in IMPLICIT_LABELS:
                    continue
                info = scrapes.label_info(metric)
                if label not in info:
                    if metric in scrapes.types or scrapes.family_of(metric) in scrapes.types:
                        if info or metric in scrapes.labels:
                            lines.append(f"  FAIL {where}: {metric} has no label {label!r} in the scrapes")
                            ok = False
                    continue
                if op == "=" and "$" not in value and value not in info[label]:
                    notes.append(f"  note {where}: {metric}{{{label}=\"{value}\"}} not seen (yet) in the scrapes")
                elif op == "=~" and "$" not in value:
                    for v in value.split("|"):
                        if re.fullmatch(r"[\w.:-]+", v) and v not in info[label]:
                            notes.append(f"  note {where}: {metric}{{{label}=\"{v}\"}} not seen (yet) in the scrapes")
        return ok, used, sorted(set(notes))

    print(f"promtool: {n_unique} distinct expressions (dashboards, variables, rules) in one rules file: "
          f"{'all parse' if not parse_errors else f'{len(parse_errors)} do not parse'}")
    if scrapes:
        print(f"scrapes: {len(args.scrape)} files, {len(scrapes.types)} metric families"
              f" ({', '.join(os.path.relpath(s) for s in args.scrape)})")
    else:
        print("scrapes: none given (--scrape FILE ...): metric names not checked")

    for (name, lines, ok), exprs in zip(reports, per_dash):
        if exprs is not None:
            for where, _ in exprs:
                if (name, where) in parse_errors:
                    lines.append(f"  FAIL {where}: does not parse: {parse_errors[(name, where)]}")
                    ok = False
            names_ok, used, notes = check_names(exprs, lines)
            ok = ok and names_ok
            if scrapes:
                lines.insert(1, f"  {len(used)} metric names referenced, "
                                f"{'all found' if names_ok else 'SOME MISSING'} in the scrapes")
            lines.extend(notes)
        print(f"{'OK  ' if ok else 'FAIL'} {name}")
        for line in lines:
            print(line)
        failed |= not ok

    lines = []
    ok = True
    for (key, where), _ in [(k, e) for k, e in parse_items if k[0] == rules_where]:
        if (key, where) in parse_errors:
            lines.append(f"  FAIL {where}: does not parse: {parse_errors[(key, where)]}")
            ok = False
    names_ok, used, notes = check_names(rule_exprs, lines)
    ok = ok and names_ok
    header = f"  {len(rule_exprs)} rules, {len(records)} recorded names, {len(used)} metric names referenced"
    if scrapes:
        header += f", {'all found' if names_ok else 'SOME MISSING'} in the scrapes"
    lines.insert(0, header)
    lines.extend(notes)
    print(f"{'OK  ' if ok else 'FAIL'} rules ({', '.join(os.path.relpath(r, ROOT) for r in rule_files)})")
    for line in lines:
        print(line)
    failed |= not ok

    print("FAILED" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
