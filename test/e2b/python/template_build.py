"""E2B's Template builder (the vendored e2b 2.34.0) against a Sheepfold
server: TestE2BTemplateBuild (test/integration) runs this with
PYTHONPATH, E2B_API_URL, E2B_SANDBOX_URL and an admin E2B_API_KEY.

It builds a template from `base` with set_envs, copy (a file uploaded
through the build's upload link), run_cmd (as root and as user),
set_workdir and set_start_cmd, creates a sandbox of it and reads what the
build made; then checks that a step that cannot run here (an image of a
public registry) fails with a clear error. Prints RESULT lines the Go
test checks.
"""

import os
import sys
import tempfile

from e2b import Sandbox, Template, wait_for_file
from e2b.exceptions import BuildException, TemplateException

name = sys.argv[1] if len(sys.argv) > 1 else "sdkbuilt"
ctx = tempfile.mkdtemp()
os.makedirs(os.path.join(ctx, "data"))
with open(os.path.join(ctx, "hello.txt"), "w") as f:
    f.write("hello from the context\n")
with open(os.path.join(ctx, "data", "a.csv"), "w") as f:
    f.write("x,y\n1,2\n")

t = (
    Template(file_context_path=ctx)
    .from_template("base")
    .set_envs({"GREETING": "hi there"})
    .copy("hello.txt", "/opt/app/hello.txt")
    .copy("data", "/opt/app/data")
    .run_cmd('echo "$GREETING from run_cmd" > /opt/app/made.txt && id -un >> /opt/app/made.txt')
    .run_cmd("id -un > /tmp/as-user.txt", user="user")
    .set_workdir("/opt/app")
    .set_start_cmd("touch /tmp/started", wait_for_file("/tmp/started"))
)
logs = []
info = Template.build(t, name, on_build_logs=lambda e: logs.append(str(e)))
print("RESULT built", info.template_id, info.build_id, flush=True)
print("RESULT logs", len(logs), any("RUN" in line for line in logs), flush=True)

sb = Sandbox.create(name, timeout=60)
try:
    print("RESULT made", repr(sb.files.read("/opt/app/made.txt")), flush=True)
    print("RESULT hello", repr(sb.files.read("/opt/app/hello.txt")), flush=True)
    print("RESULT csv", repr(sb.files.read("/opt/app/data/a.csv")), flush=True)
    print("RESULT asuser", repr(sb.files.read("/tmp/as-user.txt")), flush=True)
finally:
    sb.kill()

# An image of a public registry: this server reaches none.
try:
    Template.build(Template().from_image("python:3.12").run_cmd("true"), name + "-hub")
    print("RESULT hub built", flush=True)
except (BuildException, TemplateException) as e:
    print("RESULT hub refused", type(e).__name__, str(e).replace("\n", " "), flush=True)

# An image of a registry the server allows (the Go test's, on loopback):
# no shell in it, so only files are added.
image = os.environ.get("SHEEPFOLD_TEST_IMAGE")
if image:
    t = Template(file_context_path=ctx).from_image(image).copy("hello.txt", "/srv/hello.txt").set_envs({"FROM": "registry"})
    info = Template.build(t, name + "-img")
    print("RESULT image built", info.template_id, flush=True)
