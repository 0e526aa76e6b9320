#!/usr/bin/env python3
"""docs/options.md is what the daemons print: fail when it differs.

docs/options.md is generated from the option tables (common/options.h): a fixed
header, then the output of

    kvpool-master --options-markdown     (master/core/master_options.c)
    kvpool serve --options-markdown      (client/tools/cli/serve.c)
    kvpool --options-markdown            (client/tools/cli/main.c: the global options)
    kvpool --env-markdown                (client/env.c)
    kvpool-indexer --options-markdown    (indexer/main.c; found beside the master's build
                                          folder: BUILD/indexer/kvpool-indexer)

usage: check_options_doc.py MASTER_BIN CLI_BIN DOC [--write]
  --write: regenerate DOC instead of checking it.
"""
import difflib
import os
import subprocess
import sys

HEADER = """# Options

Every option of the daemons, and the client library's environment variables,
one row each. This file is generated from the option tables in the source
(common/options.h) by `tests/check_options_doc.py build/master/kvpool-master
build/client/kvpool docs/options.md --write`; the `options_doc` test fails when
it differs from what the binaries print. Do not edit it by hand: edit the table
and regenerate.

"""


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True,
                          timeout=30).stdout


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    write = "--write" in sys.argv[1:]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    master, cli, doc = args
    indexer = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(master))), "indexer",
                           "kvpool-indexer")
    parts = [run([master, "--options-markdown"]), run([cli, "serve", "--options-markdown"]),
             run([cli, "--options-markdown"]), run([cli, "--env-markdown"]),
             run([indexer, "--options-markdown"])]
    want = HEADER + "\n".join(parts)
    if write:
        with open(doc, "w") as f:
            f.write(want)
        print(f"wrote {doc}")
        return 0
    with open(doc) as f:
        have = f.read()
    if have == want:
        print(f"{doc} is what the binaries print")
        return 0
    sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                               doc, "generated"))
    print(f"{doc} differs from the option tables: run tests/check_options_doc.py "
          f"MASTER_BIN CLI_BIN {doc} --write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
