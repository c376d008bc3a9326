// Validates manifests rendered by `helm template` (scripts/check_helm.sh):
//   1. each object against its Kubernetes JSON schema (kubernetes-models; the Prometheus
//      operator's and cert-manager's models for ServiceMonitor and Certificate): types,
//      required fields, formats, enums;
//   2. unknown fields, which those schemas let through (a misspelt livenessProbe would be
//      dropped silently or refused by the API server): every object is type-checked as a
//      TypeScript literal of the model's interface, whose excess-property check names them;
//   3. what this chart promises: grace periods longer than --shutdown-grace-ms, --insecure
//      exactly when TLS is off, grpc probes without TLS and tcpSocket with it, the workers'
//      --cache-servers list in the StatefulSet's ordinal order, selectors that select,
//      volumes that exist, Secrets never mounted by subPath, no --gpu-capacity;
//   4. with LAZYKV_BIN set (a build's bin/ folder): every flag the chart passes is one the
//      binary's --help lists.
//
//   [LAZYKV_BIN=build/bin] node validate-manifests.mjs NODE_MODULES_DIR RENDERED.yaml...
// Prints "ok ..." or "FAIL ..." lines; exits 1 on any failure.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [modulesArg, ...files] = process.argv.slice(2);
if (!modulesArg || files.length === 0) {
  console.error("usage: validate-manifests.mjs NODE_MODULES_DIR RENDERED.yaml...");
  process.exit(2);
}
const nodeModules = resolve(modulesArg);
const require = createRequire(join(nodeModules, "_.js"));
const YAML = require("yaml");
const ts = require("typescript");

// apiVersion/kind -> model module (without .js), its interface name is "I" + kind.
const MODELS = {
  "v1/Service": "kubernetes-models/v1/Service",
  "v1/Secret": "kubernetes-models/v1/Secret",
  "v1/ConfigMap": "kubernetes-models/v1/ConfigMap",
  "apps/v1/StatefulSet": "kubernetes-models/apps/v1/StatefulSet",
  "apps/v1/Deployment": "kubernetes-models/apps/v1/Deployment",
  "policy/v1/PodDisruptionBudget": "kubernetes-models/policy/v1/PodDisruptionBudget",
  "monitoring.coreos.com/v1/ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "cert-manager.io/v1/Certificate": "@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate",
};

let failed = false;
const ok = (line) => console.log(`ok ${line}`);
const fail = (line) => {
  failed = true;
  console.log(`FAIL ${line}`);
};
const id = (o) => `${o.kind}/${o.metadata?.name}`;

// --- load ---------------------------------------------------------------------------------
const releases = [];
for (const file of files) {
  const release = basename(file).replace(/\.yaml$/, "");
  const objects = [];
  for (const doc of YAML.parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      fail(`yaml: ${release}: ${doc.errors[0].message}`);
      continue;
    }
    const o = doc.toJS();
    if (o !== null && o !== undefined) objects.push(o);
  }
  releases.push({ release, objects });
}

// --- 1. JSON schemas ----------------------------------------------------------------------
const modelCache = new Map();
async function model(key) {
  if (!modelCache.has(key)) {
    const mod = await import(pathToFileURL(join(nodeModules, `${MODELS[key]}.js`)).href);
    modelCache.set(key, mod[key.split("/").pop()]);
  }
  return modelCache.get(key);
}
for (const { release, objects } of releases) {
  const errors = [];
  for (const o of objects) {
    const key = `${o.apiVersion}/${o.kind}`;
    if (!MODELS[key]) {
      errors.push(`${id(o)}: no schema here for ${key}`);
      continue;
    }
    try {
      new (await model(key))(o).validate();
    } catch (e) {
      errors.push(`${id(o)}: ${e.message}`);
    }
    if (!o.metadata?.name) errors.push(`${key}: no metadata.name`);
  }
  if (errors.length) errors.forEach((e) => fail(`kubernetes schemas: ${release}: ${e}`));
  else ok(`kubernetes schemas: ${release} (${objects.length} objects: ${[...new Set(objects.map((o) => o.kind))].join(", ")})`);
}

// --- 2. unknown fields (TypeScript excess-property checks) ---------------------------------
{
  const lines = [];
  const where = [];
  const imports = new Map();
  for (const { release, objects } of releases) {
    for (const o of objects) {
      const key = `${o.apiVersion}/${o.kind}`;
      if (!MODELS[key]) continue;
      const type = `I${o.kind}`;
      imports.set(type, MODELS[key]);
      lines.push(`export const m${where.length}: ${type} = ${JSON.stringify(o)};`);
      where.push(`${release}: ${id(o)}`);
    }
  }
  const header = [...imports].map(([type, mod]) => `import type { ${type} } from "${mod}";`);
  const dir = mkdtempSync(join(dirname(nodeModules), "tscheck-"));
  const file = join(dir, "manifests.ts");
  writeFileSync(file, [...header, ...lines].join("\n") + "\n");
  const program = ts.createProgram([file], {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
  });
  const diagnostics = ts.getPreEmitDiagnostics(program);
  rmSync(dir, { recursive: true, force: true });
  if (diagnostics.length === 0) {
    ok(`unknown fields (TypeScript ${ts.version} over the models): ${where.length} objects`);
  }
  for (const d of diagnostics) {
    const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
    let at = "";
    if (d.file && d.start !== undefined) {
      const line = d.file.getLineAndCharacterOfPosition(d.start).line - header.length;
      at = where[line] ?? `line ${line}`;
    }
    fail(`unknown fields: ${at}: ${message.slice(0, 300)}`);
  }
}

// --- 3. what the chart promises ----------------------------------------------------------
const argValue = (args, flag) => {
  const a = args.find((x) => x === flag || x.startsWith(`${flag}=`));
  return a === undefined ? undefined : a.includes("=") ? a.slice(a.indexOf("=") + 1) : true;
};
const matches = (selector, labels) => Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const bytes = (text) => {
  const m = /^([0-9.]+)\s*([KMGT]i?)?B?$/i.exec(String(text));
  if (!m) return NaN;
  const p = { "": 0, k: 1, m: 2, g: 3, t: 4 }[(m[2] ?? "").charAt(0).toLowerCase()];
  return Number(m[1]) * 1024 ** p;
};
const quantity = (text) => {
  const m = /^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(text));
  if (!m) return NaN;
  const scale = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return Number(m[1]) * (m[2] ? scale[m[2]] : 1);
};

for (const { release, objects } of releases) {
  const errors = [];
  const check = (cond, message) => cond || errors.push(message);
  const workloads = objects.filter((o) => o.kind === "StatefulSet" || o.kind === "Deployment");
  const services = objects.filter((o) => o.kind === "Service");
  const cache = workloads.find((o) => o.kind === "StatefulSet");

  for (const w of workloads) {
    const pod = w.spec.template.spec;
    const claimNames = (w.spec.volumeClaimTemplates ?? []).map((c) => c.metadata.name);
    const volumes = new Map((pod.volumes ?? []).map((v) => [v.name, v]));
    check(matches(w.spec.selector.matchLabels, w.spec.template.metadata.labels), `${id(w)}: selector does not select its pods`);
    for (const c of pod.containers) {
      const args = c.args ?? [];
      const where = `${id(w)} ${c.name}`;
      const grace = Number(argValue(args, "--shutdown-grace-ms"));
      check(Number.isFinite(grace), `${where}: no --shutdown-grace-ms`);
      check(pod.terminationGracePeriodSeconds * 1000 > grace,
        `${where}: terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} s is not longer than --shutdown-grace-ms ${grace}`);
      check(!args.some((a) => a.startsWith("--gpu-capacity")), `${where}: passes --gpu-capacity`);
      const tls = argValue(args, "--tls-cert") !== undefined;
      check(tls !== (argValue(args, "--insecure") === true), `${where}: --insecure must be given exactly when TLS is off`);
      for (const p of ["startupProbe", "livenessProbe", "readinessProbe"]) {
        check(c[p] !== undefined, `${where}: no ${p}`);
        if (c[p]) check(tls ? c[p].tcpSocket && !c[p].grpc : c[p].grpc && !c[p].tcpSocket,
          `${where}: ${p} must be ${tls ? "tcpSocket (grpc probes cannot speak TLS)" : "grpc"}`);
      }
      const listen = argValue(args, "--listen");
      const port = c.ports?.find((p) => p.name === "grpc")?.containerPort;
      check(typeof listen === "string" && listen.endsWith(`:${port}`), `${where}: --listen ${listen} is not the grpc port ${port}`);
      if (tls) {
        for (const f of ["--tls-key", "--tls-cert"]) check(argValue(args, f), `${where}: TLS without ${f}`);
      }
      for (const m of c.volumeMounts ?? []) {
        check(volumes.has(m.name) || claimNames.includes(m.name), `${where}: mounts ${m.name}, which is not a volume`);
        if (volumes.get(m.name)?.secret) check(!m.subPath, `${where}: Secret ${m.name} is mounted by subPath (rotations would not reach it)`);
      }
      const cacheServers = argValue(args, "--cache-servers");
      if (cacheServers !== undefined) {
        check(cache, `${where}: --cache-servers without a cache StatefulSet`);
        if (cache) {
          const ns = cache.metadata.namespace;
          const cachePort = cache.spec.template.spec.containers[0].ports.find((p) => p.name === "grpc").containerPort;
          const want = [...Array(cache.spec.replicas).keys()]
            .map((i) => `${cache.metadata.name}-${i}.${cache.spec.serviceName}.${ns}.svc.cluster.local:${cachePort}`)
            .join(",");
          check(cacheServers === want, `${where}: --cache-servers=${cacheServers}, want ${want}`);
          check(tls === (argValue(args, "--cache-tls-ca") !== undefined), `${where}: --cache-tls-ca must follow TLS`);
          if (tls) check(argValue(args, "--cache-tls-cert") && argValue(args, "--cache-tls-key"), `${where}: no client certificate for mutual TLS`);
        }
      }
      const host = argValue(args, "--host-capacity");
      const limit = c.resources?.limits?.memory;
      if (host !== undefined && limit !== undefined) {
        check(bytes(host) < quantity(limit), `${where}: --host-capacity ${host} is not under the memory limit ${limit}`);
      }
    }
  }
  if (cache) {
    const headless = services.find((s) => s.metadata.name === cache.spec.serviceName);
    check(headless && headless.spec.clusterIP === "None", `${id(cache)}: serviceName ${cache.spec.serviceName} is not a headless Service`);
    check(cache.spec.template.spec.containers[0].args.includes("--tls-client-ca=/etc/lazykv/tls/ca.crt") ===
      cache.spec.template.spec.containers[0].args.some((a) => a.startsWith("--tls-cert")), `${id(cache)}: TLS without mutual TLS`);
  }
  for (const s of services) {
    const targets = workloads.filter((w) => matches(s.spec.selector, w.spec.template.metadata.labels));
    check(targets.length === 1, `${id(s)}: selects ${targets.length} workloads`);
    for (const p of s.spec.ports) {
      check(targets.every((w) => w.spec.template.spec.containers.some((c) => (c.ports ?? []).some((cp) => cp.name === p.targetPort))),
        `${id(s)}: targetPort ${p.targetPort} is no container port`);
    }
  }
  for (const o of objects.filter((x) => x.kind === "PodDisruptionBudget" || x.kind === "ServiceMonitor")) {
    const labels = o.spec.selector.matchLabels;
    const pool = o.kind === "ServiceMonitor" ? services.map((s) => s.metadata.labels) : workloads.map((w) => w.spec.template.metadata.labels);
    check(pool.some((l) => matches(labels, l)), `${id(o)}: selects nothing`);
  }
  if (errors.length) errors.forEach((e) => fail(`chart invariants: ${release}: ${e}`));
  else ok(`chart invariants: ${release}`);
}
// --- 4. flags the binaries know ----------------------------------------------------------
if (process.env.LAZYKV_BIN) {
  const usage = new Map();
  const unknown = new Set();
  let count = 0;
  for (const { objects } of releases) {
    for (const w of objects.filter((o) => o.kind === "StatefulSet" || o.kind === "Deployment")) {
      for (const c of w.spec.template.spec.containers) {
        const program = basename(c.command[0]);
        if (!usage.has(program)) {
          let text = "";
          try {
            text = execFileSync(join(process.env.LAZYKV_BIN, program), ["--help"], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
          } catch (e) {
            text = `${e.stdout ?? ""}${e.stderr ?? ""}`;
          }
          usage.set(program, new Set(text.match(/--[a-z][-a-z0-9]*/g) ?? []));
        }
        for (const a of c.args ?? []) {
          const flag = a.split("=")[0];
          count++;
          if (!usage.get(program).has(flag)) unknown.add(`${program} ${flag}`);
        }
      }
    }
  }
  if (unknown.size) fail(`flags: not in the binaries' --help: ${[...unknown].join(", ")}`);
  else ok(`flags: all ${count} rendered arguments are flags of ${[...usage.keys()].join(" and ")} (${process.env.LAZYKV_BIN})`);
}
process.exit(failed ? 1 : 0);
