"""CIFAR-10-C generated on the fly: Hendrycks' 15 corruptions x 5 severities as batched torch kernels.

Transcribes ``ImageNet-C/create_c/make_cifar_c.py`` (hendrycks/robustness) with its **CIFAR** constants (not the
ImageNet-C constants of the ``imagecorruptions`` package). Kernels run on CPU or CUDA, batched over images; the
only per-image Python loops are drawing random fields (one generator per image) and the JPEG codec.

API
---
``corrupt(images, name, severity, seed)``: float [B, 3, H, W] in [0, 1] -> same shape, dtype and device.
``corrupt_uint8(images_nhwc, name, severity, seed)``: uint8 [N, H, W, 3] -> uint8, like the reference files.
``CORRUPTIONS`` (Hendrycks' order) and ``SEVERITIES = (1, 2, 3, 4, 5)``; unknown names/severities raise ValueError.

Precision and quantisation
--------------------------
Kernels compute in float64, as the reference's NumPy code does, on inputs snapped to exactly ``k/255`` when they
are within 1e-4 levels of the 8-bit grid (so float32 ``k/255`` inputs behave like the reference's uint8 ones).
The reference casts its float output with ``np.uint8`` (truncation), so ``corrupt`` returns
``floor(255 * clip(y, 0, 1)) / 255``, cast back to the input dtype. Exception: motion_blur rounds to the nearest
level, because the reference's result is ImageMagick's 8-bit PNG output (rounded), not a truncated float.
Against ``make_cifar_c.py`` itself (NumPy, SciPy 1.17, scikit-image 0.26, OpenCV 4.10, Pillow 13; ImageMagick
replaced as below) fed the same random fields, on 48 CIFAR-10 test images at all severities: noise, glass, motion,
frost, fog, brightness, contrast, pixelate and JPEG are identical; defocus (cv2's float32 kernel and summation
order), zoom, snow and elastic (float32 arithmetic in the reference) differ by one level on < 0.6 % of values.

Seeding
-------
``seed`` is one int (image i uses ``derive_seed(seed, i)``) or B per-image ints (sequence or tensor). Image i's
fields come from ``torch_generator(seed_i, "corruption", name, severity)`` on CPU and are moved to the images'
device, so an image's output depends only on (image, name, severity, its seed): not on batch size, neighbours or
device (CPU and CUDA agree up to float round-off, i.e. at most one level on rare pixels).

Other image sizes (any H, W >= 16, e.g. digits 28x28, Office 64-224 px)
---------------------------------------------------------------------
Constants stay CIFAR's (so e.g. blur radii are in pixels and the elastic constants are ``32 * (...)`` for any
size); loops hard-coded to 32 in the reference use H and W (glass blur scan ``range(H - d, d, -1)``, pixelate
``int(H c) x int(W c)``, zoom crops per axis, elastic centre points (W//2, H//2)); the fog plasma map is the next
power of two >= max(H, W), cropped; a frost texture smaller than (H+1) x (W+1) after the 0.2 resize is replaced
by the full-resolution texture resized with Pillow BILINEAR just enough to fit the crop; motion/snow blur stops at
the first tap whose offset reaches the image size, as imagecorruptions does.

Deviations from the reference
-----------------------------
* motion_blur and snow: no ImageMagick; imagecorruptions-style line-kernel blur (see ``blur.py``).
* shot_noise: exact Poisson draws by inverting the CDF at a uniform field, with rates from 8-bit levels.
* pixelate and jpeg_compression work on the 8-bit levels ``round(255 x)`` (the reference input is uint8).
* elastic_transform's affine step reproduces the fixed-point warpAffine of OpenCV 3.4-4.10 (checked: 4.10);
  OpenCV 5.0 samples at float coordinates, so a run of the reference with it differs by sub-1/32-pixel shifts
  (up to 3 levels on ~15 % of values).
* Random streams differ from NumPy's global RNG (the reference sets no seed, so CIFAR-10-C itself is one draw).
"""
from .registry import CORRUPTIONS, SEVERITIES, corrupt, corrupt_uint8, get_spec, image_seeds

__all__ = ["CORRUPTIONS", "SEVERITIES", "corrupt", "corrupt_uint8", "get_spec", "image_seeds"]
