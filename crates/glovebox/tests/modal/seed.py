"""The seed's Modal program, unchanged but for its configuration, which is the environment
(MODAL_SERVER_URL, MODAL_TOKEN_ID, MODAL_TOKEN_SECRET): an image built in Python, code run in
a sandbox with a budget and no network."""

import modal

app = modal.App.lookup("glovebox-seed", create_if_missing=True)
code = "import pandas as pd; print(pd.DataFrame({'x': [1, 2, 3]}).x.sum())"

image = modal.Image.debian_slim().pip_install("pandas")
sb = modal.Sandbox.create(app=app, image=image, timeout=120, cpu=1.0, memory=1024, block_network=True)
p = sb.exec("python", "-c", code, timeout=15)
out, err = p.stdout.read(), p.stderr.read(); code = p.wait()
sb.terminate()

print(out, end="")
print(err, end="")
print("exit code:", code)
