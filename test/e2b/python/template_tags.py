"""E2B's template list, aliases and tags (the vendored e2b 2.34.0) against
a Sheepfold server: TestE2BTemplateBuild (test/integration) runs this
after template_build.py, with the same environment and an admin key.

It builds NAME:v1 (a file saying "one"), then NAME again (saying "two"),
checks Template.exists / alias_exists, lists the templates, reads the
tags, assigns and removes tags, and creates sandboxes from NAME:TAG,
reading which build each got. Prints RESULT lines the Go test checks.
"""

import sys

from e2b import Sandbox, Template
from e2b.api.client.api.templates import get_templates
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import TemplateException

name = sys.argv[1] if len(sys.argv) > 1 else "sdktags"


def version(ref):
    sb = Sandbox.create(ref, timeout=60)
    try:
        return sb.commands.run("cat /etc/sdk-version").stdout.strip()
    finally:
        sb.kill()


def build(ref, ver):
    t = Template().from_template("base").run_cmd(f"echo {ver} > /etc/sdk-version", user="root")
    return Template.build(t, ref)


one = build(name + ":v1", "one")
two = build(name, "two")
print("RESULT exists", Template.exists(name), Template.exists(name + ":v1"),
      Template.alias_exists("no-such-template"), Template.exists(name + ":nope"), flush=True)

res = get_templates.sync_detailed(client=get_api_client(ConnectionConfig()))
listed = {t.template_id: t for t in res.parsed}
print("RESULT listed", res.status_code, name in listed, listed[name].build_status.value,
      name + ":v1" in listed, flush=True)

tags = {t.tag: t.build_id for t in Template.get_tags(name)}
print("RESULT tags", sorted(tags), tags["v1"] != tags["default"], flush=True)
print("RESULT versions", version(name), version(name + ":v1"), version(name + ":default"), flush=True)

info = Template.assign_tags(name + ":v1", ["stable", "prod"])
print("RESULT assigned", sorted(info.tags), info.build_id == tags["v1"], flush=True)
print("RESULT stable", version(name + ":stable"), flush=True)
info = Template.assign_tags(name, "stable")
print("RESULT moved", version(name + ":stable"), info.build_id == tags["default"], flush=True)

Template.remove_tags(name, ["prod"])
print("RESULT removed", sorted(t.tag for t in Template.get_tags(name)), Template.exists(name + ":prod"), flush=True)
try:
    Sandbox.create(name + ":prod", timeout=60)
    print("RESULT untagged create succeeded", flush=True)
except Exception as e:  # noqa: BLE001 - the SDK's error type is what is printed
    print("RESULT untagged create refused", type(e).__name__, flush=True)
try:
    Template.remove_tags(name, ["never"])
    print("RESULT remove unknown succeeded", flush=True)
except TemplateException as e:
    print("RESULT remove unknown refused", type(e).__name__, flush=True)

# A tag moved while a sandbox runs on its old copy: the move succeeds,
# the sandbox goes on with the old files, a new sandbox of the tag gets
# the new ones, and the old copy goes from disk with the sandbox. "solo"
# is a copy of NAME's build ("two") that no other tag shares; it moves
# to v1's ("one").
import os  # noqa: E402

tags_dir = os.path.join(os.environ["SHEEPFOLD_TEST_DATA"], "templates", ".tags", name)
Template.assign_tags(name, "solo")
solo_copy = os.readlink(os.path.join(tags_dir, "solo"))
old = Sandbox.create(name + ":solo", timeout=120)
try:
    Template.assign_tags(name + ":v1", "solo")
    print("RESULT solo moved", solo_copy in os.listdir(tags_dir), os.readlink(os.path.join(tags_dir, "solo")) != solo_copy, flush=True)
    print("RESULT old sandbox", old.commands.run("cat /etc/sdk-version").stdout.strip(),
          old.commands.run("python3 -c 'print(6 * 7, open(\"/etc/sdk-version\").read().strip())'").stdout.strip(),
          old.commands.run("ls /usr/bin/python3").stdout.strip(), flush=True)
    print("RESULT new sandbox", version(name + ":solo"), flush=True)
finally:
    old.kill()
print("RESULT old copy after the kill", solo_copy in os.listdir(tags_dir), flush=True)
try:
    Template.assign_tags(name, ["Bad Tag"])
    print("RESULT bad tag succeeded", flush=True)
except Exception as e:  # noqa: BLE001 - the SDK's error type is what is printed
    print("RESULT bad tag refused", type(e).__name__, "invalid tag" in str(e), flush=True)

# A template's last USER and WORKDIR are its sandboxes' defaults (E2B's
# semantics): a command that names neither runs as that user in that
# directory; a command's own user and cwd win.
owned = Template().from_template("base").run_cmd("mkdir -p /srv/x && echo here > /srv/x/mark", user="root") \
    .set_workdir("/srv/x").set_user("nobody")
Template.build(owned, name + "-owned")
sb = Sandbox.create(name + "-owned", timeout=120)
try:
    print("RESULT owned default", sb.commands.run("echo $(id -u) $(pwd) $(cat mark)").stdout.strip(), flush=True)
    print("RESULT owned explicit", sb.commands.run("echo $(id -u) $(pwd)", user="root", cwd="/tmp").stdout.strip(), flush=True)
    print("RESULT owned python", sb.commands.run("python3 -c 'import os; print(os.getuid(), os.getcwd())'").stdout.strip(), flush=True)
finally:
    sb.kill()
sb = Sandbox.create("base", timeout=60)
try:
    print("RESULT base default", sb.commands.run("echo $(id -u) $(pwd)").stdout.strip(), flush=True)
finally:
    sb.kill()
