"""Builds the seed's image (Image.debian_slim().pip_install("pandas")) and prints how long
that took and whether the server had it already."""

import time

import modal
from modal._utils.async_utils import synchronizer

app = modal.App.lookup("glovebox-seed", create_if_missing=True)
t0 = time.monotonic()
image = modal.Image.debian_slim().pip_install("pandas").build(app)
print(f"image: {image.object_id}")
print(f"build_s: {time.monotonic() - t0:.3f}")
# Whether the server answered with the image built (the client's own flag, on the object the
# synchronous wrapper stands for).
print(f"cache_hit: {synchronizer._translate_in(image)._cache_hit}")
