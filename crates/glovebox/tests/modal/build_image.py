"""Builds the seed's image (Image.debian_slim().pip_install("pandas")) and prints how long
that took and whether the server had it already."""

import time

import modal

app = modal.App.lookup("glovebox-seed", create_if_missing=True)
t0 = time.monotonic()
image = modal.Image.debian_slim().pip_install("pandas").build(app)
print(f"image: {image.object_id}")
print(f"build_s: {time.monotonic() - t0:.3f}")
print(f"cache_hit: {image._cache_hit}")
