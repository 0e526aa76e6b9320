#!/usr/bin/env python3
"""Structural checks of deploy/k8s/**/*.yaml that `kubectl apply
--dry-run=client` does not make offline (it has no API schema there):

- every document parses, has apiVersion, kind, metadata.name and the kvpool
  namespace (but the Namespace itself);
- workloads: the selector matches the pod template's labels; containers have
  a name and an image; every $(VAR) in command/args is an env var defined
  before; volumeMounts name declared volumes; configMap references (volumes,
  envFrom) exist among the manifests; hugepages requests equal limits;
  probes' named ports exist;
- fields are known (a small allow-list of pod/container fields, to catch
  typos a schema would);
- the kvpool config in ConfigMap kvpool-config parses as INI with [master]
  and [serve] sections.

usage: check_manifests.py DIR...   (prints problems; exit 1 if any)
"""
import configparser
import glob
import os
import re
import sys

import yaml

POD_SPEC = {"containers", "initContainers", "volumes", "hostNetwork", "hostPID", "hostIPC",
            "dnsPolicy", "nodeSelector", "tolerations", "affinity", "serviceAccountName",
            "terminationGracePeriodSeconds", "securityContext", "priorityClassName",
            "restartPolicy", "imagePullSecrets", "topologySpreadConstraints"}
CONTAINER = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports",
             "livenessProbe", "readinessProbe", "startupProbe", "resources", "securityContext",
             "volumeMounts", "workingDir", "lifecycle"}
PROBE = {"httpGet", "tcpSocket", "exec", "initialDelaySeconds", "periodSeconds",
         "timeoutSeconds", "failureThreshold", "successThreshold"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def check_keys(where, obj, allowed):
    for k in obj:
        if k not in allowed:
            err(where, f"unknown field {k!r}")


def check_probe(where, probe, port_names):
    check_keys(where, probe, PROBE)
    for kind in ("httpGet", "tcpSocket"):
        port = probe.get(kind, {}).get("port")
        if isinstance(port, str) and port not in port_names:
            err(where, f"probe port {port!r} is not a named port of the container")


def check_workload(where, doc, configmaps):
    spec = doc.get("spec", {})
    tmpl = spec.get("template", {})
    labels = tmpl.get("metadata", {}).get("labels", {}) or {}
    match = spec.get("selector", {}).get("matchLabels", {}) or {}
    if not match:
        err(where, "no spec.selector.matchLabels")
    for k, v in match.items():
        if labels.get(k) != v:
            err(where, f"selector {k}={v} does not match the template's labels")
    pod = tmpl.get("spec", {})
    check_keys(where + " pod spec", pod, POD_SPEC)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    vct = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    for v in volumes.values():
        cm = v.get("configMap", {}).get("name")
        if cm and cm not in configmaps:
            err(where, f"volume {v['name']}: ConfigMap {cm} not among the manifests")
    if not pod.get("containers"):
        err(where, "no containers")
    for c in pod.get("containers", []):
        cw = f"{where} container {c.get('name')}"
        check_keys(cw, c, CONTAINER)
        if not c.get("name") or not c.get("image"):
            err(cw, "needs a name and an image")
        env = [e["name"] for e in c.get("env", [])]
        for ef in c.get("envFrom", []):
            cm = ef.get("configMapRef", {}).get("name")
            if cm and cm not in configmaps:
                err(cw, f"envFrom: ConfigMap {cm} not among the manifests")
            if cm in configmaps:
                env += list(configmaps[cm].get("data", {}))
        for a in c.get("command", []) + c.get("args", []):
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(a)):
                if var not in env:
                    err(cw, f"$({var}) in command/args is not a defined env var")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes and m["name"] not in vct:
                err(cw, f"volumeMount {m['name']} names no volume")
        ports = {p["name"] for p in c.get("ports", []) if "name" in p}
        for p in ("livenessProbe", "readinessProbe", "startupProbe"):
            if p in c:
                check_probe(f"{cw} {p}", c[p], ports)
        res = c.get("resources", {})
        for k, v in res.get("limits", {}).items():
            if k.startswith("hugepages-") and res.get("requests", {}).get(k, v) != v:
                err(cw, f"{k}: requests must equal limits")


def main():
    docs = []
    for d in sys.argv[1:]:
        for path in sorted(glob.glob(os.path.join(d, "**", "*.yaml"), recursive=True)):
            try:
                with open(path) as f:
                    for i, doc in enumerate(yaml.safe_load_all(f)):
                        if doc is not None:
                            docs.append((f"{os.path.relpath(path)}#{i}", doc))
            except yaml.YAMLError as e:
                err(path, f"YAML: {e}")
    if not docs:
        err("manifests", "none found")
    configmaps = {doc["metadata"]["name"]: doc for _, doc in docs
                  if isinstance(doc, dict) and doc.get("kind") == "ConfigMap"}
    kinds = set()
    for where, doc in docs:
        if not isinstance(doc, dict):
            err(where, "not a mapping")
            continue
        for k in ("apiVersion", "kind", "metadata"):
            if k not in doc:
                err(where, f"no {k}")
        meta = doc.get("metadata", {})
        name = meta.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
            err(where, f"bad metadata.name {name!r}")
        where = f"{where} {doc.get('kind')}/{name}"
        kinds.add(doc.get("kind"))
        if doc.get("kind") != "Namespace" and meta.get("namespace") != "kvpool":
            err(where, "not in namespace kvpool")
        if doc.get("kind") in WORKLOADS:
            check_workload(where, doc, configmaps)
        if doc.get("kind") == "Service":
            for p in doc.get("spec", {}).get("ports", []):
                if "port" not in p:
                    err(where, "a port without port:")
    for k in ("Namespace", "ConfigMap", "StatefulSet", "Deployment", "DaemonSet", "Service"):
        if k not in kinds:
            err("manifests", f"no {k}")
    cm = configmaps.get("kvpool-config", {}).get("data", {}).get("kvpool.conf")
    if cm is None:
        err("ConfigMap kvpool-config", "no kvpool.conf")
    else:
        ini = configparser.ConfigParser(strict=True, interpolation=None)
        try:
            ini.read_string(cm)
            for s in ("master", "serve"):
                if s not in ini:
                    err("ConfigMap kvpool-config", f"no [{s}] section")
        except configparser.Error as e:
            err("ConfigMap kvpool-config", f"INI: {e}")
    for e in errors:
        print(e)
    print(f"{len(docs)} documents, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
