#!/usr/bin/env python3
"""Check example config files (deploy/configs/*.conf, and kvpool.conf inside
deploy/k8s's ConfigMap) against the daemons' flags: every key, commented-out
examples ("# key = value") included, must be a long flag in the --help text
of the daemon whose section holds it ([master]: kvpool-master, [serve]:
kvpool serve; keys before any section: both).

usage: check_configs.py MASTER_BIN CLI_BIN FILE...   (FILE: .conf or .yaml)
"""
import re
import subprocess
import sys

import yaml


def help_text(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=10)
    return p.stdout


def flags(text):
    return set(re.findall(r"--([a-z][a-z0-9-]*)", text))


def conf_texts(path):
    if path.endswith(".yaml"):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
                    for k, v in doc.get("data", {}).items():
                        if k.endswith(".conf"):
                            yield f"{path}:{k}", v
    else:
        with open(path) as f:
            yield path, f.read()


def main():
    master_bin, cli_bin, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    known = {"master": flags(help_text([master_bin, "--help"])),
             "serve": flags(help_text([cli_bin, "serve", "--help"])) |
             flags(help_text([cli_bin, "--help"]))}
    problems = 0
    nkeys = 0
    for path in files:
        for name, text in conf_texts(path):
            section = None
            for n, line in enumerate(text.splitlines(), 1):
                s = line.strip()
                m = re.fullmatch(r"\[([^\]]+)\]", s)
                if m:
                    section = m.group(1).strip()
                    if section not in known:
                        print(f"{name}:{n}: unknown section [{section}]")
                        problems += 1
                    continue
                m = re.fullmatch(r"[#;]?\s*([a-z][a-z0-9-]*)\s*=\s*(.*)", s)
                if not m:
                    continue
                key = m.group(1)
                nkeys += 1
                for sec in ([section] if section else ["master", "serve"]):
                    if sec in known and key not in known[sec]:
                        print(f"{name}:{n}: '{key}' is no flag of "
                              f"{'kvpool-master' if sec == 'master' else 'kvpool serve'}")
                        problems += 1
    print(f"{nkeys} keys checked, {problems} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
