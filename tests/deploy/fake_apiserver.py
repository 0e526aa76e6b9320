#!/usr/bin/env python3
"""A stand-in for a Kubernetes API server, enough for
`kubectl apply --dry-run=client` to run offline (tests/deploy/test_deploy.sh).

kubectl needs the server's discovery documents to map each manifest's kind to
a resource, and GETs each object to decide between create and patch. This
serves discovery for the API groups and kinds deploy/k8s uses and answers
404 NotFound to every object GET (so each object is a dry-run "create").
Schema validation (/openapi/v2) is not served: run kubectl with
--validate=false; the test checks the manifests' structure itself.

usage: fake_apiserver.py PORTFILE   (binds 127.0.0.1:0, writes the port)
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

# group/version -> [(kind, plural, namespaced)]
RESOURCES = {
    "v1": [("ConfigMap", "configmaps", True), ("Service", "services", True),
           ("Namespace", "namespaces", False), ("ServiceAccount", "serviceaccounts", True),
           ("Secret", "secrets", True), ("Pod", "pods", True),
           ("PersistentVolumeClaim", "persistentvolumeclaims", True)],
    "apps/v1": [("Deployment", "deployments", True), ("StatefulSet", "statefulsets", True),
                ("DaemonSet", "daemonsets", True)],
    "policy/v1beta1": [("PodDisruptionBudget", "poddisruptionbudgets", True)],
    "policy/v1": [("PodDisruptionBudget", "poddisruptionbudgets", True)],
    "monitoring.coreos.com/v1": [("ServiceMonitor", "servicemonitors", True),
                                 ("PodMonitor", "podmonitors", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def resource_list(gv):
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": [{"name": plural, "singularName": kind.lower(), "namespaced": ns,
                           "kind": kind, "verbs": VERBS}
                          for kind, plural, ns in RESOURCES[gv]]}


def group_list():
    groups = {}
    for gv in RESOURCES:
        if "/" not in gv:
            continue
        g, v = gv.split("/")
        groups.setdefault(g, []).append(v)
    out = []
    for g, vs in groups.items():
        versions = [{"groupVersion": f"{g}/{v}", "version": v} for v in vs]
        out.append({"name": g, "versions": versions, "preferredVersion": versions[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def not_found(self):
        self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "reason": "NotFound", "code": 404,
                             "message": f"{self.path} not found"})

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path == "/api":
            return self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                        "serverAddressByClientCIDRs": [
                                            {"clientCIDR": "0.0.0.0/0",
                                             "serverAddress": "127.0.0.1:6443"}]})
        if path == "/apis":
            return self.send_json(200, group_list())
        if path == "/api/v1":
            return self.send_json(200, resource_list("v1"))
        if path.startswith("/apis/") and path.count("/") == 3:
            gv = path[len("/apis/"):]
            if gv in RESOURCES:
                return self.send_json(200, resource_list(gv))
        if path == "/version":
            return self.send_json(200, {"major": "1", "minor": "20", "gitVersion": "v1.20.0"})
        return self.not_found()  # objects (apply's GET), /openapi/v2, anything else

    def do_POST(self):
        self.not_found()

    do_PATCH = do_PUT = do_POST


def main():
    srv = HTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    srv.serve_forever()


if __name__ == "__main__":
    main()
