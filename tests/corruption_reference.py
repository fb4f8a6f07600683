"""NumPy/SciPy/Pillow transcriptions of Hendrycks' ``make_cifar_c.py`` (CIFAR constants) with explicit random fields.

Each function takes one uint8 HWC image (as the reference's ``np.array(pil_image)``) plus the random draws the
reference would have taken from ``np.random`` and returns the reference's float output in 0..255 (before its
``np.uint8`` cast). Library calls the reference makes are replaced by their SciPy equivalents:

* ``skimage.filters.gaussian(sigma, multichannel=True)`` -> ``scipy.ndimage.gaussian_filter(sigma=(s, s, 0),
  mode='nearest')`` (skimage's defaults); with ``mode='reflect', truncate=3`` likewise;
* ``cv2.filter2D`` / ``cv2.GaussianBlur`` (BORDER_REFLECT_101) -> ``scipy.ndimage.correlate(mode='mirror')``;
* ``cv2.getAffineTransform`` -> ``np.linalg.solve``; ``cv2.warpAffine`` -> a transcription of OpenCV's fixed-point
  remap (AB_BITS = 10, INTER_BITS = 5, float bilinear weights, BORDER_REFLECT_101);
* ``cv2.cvtColor(RGB2GRAY)`` -> 0.299 R + 0.587 G + 0.114 B; ``skimage.color`` HSV -> its formulas;
* ImageMagick's MagickMotionBlurImage -> imagecorruptions' ``_motion_blur`` followed by rounding to 8 bits;
* ``np.random.poisson(lam)`` -> ``scipy.stats.poisson.ppf(u, lam)`` (the inverse CDF at a uniform draw).
"""
from __future__ import annotations

import io
import math

import numpy as np
import scipy.stats
from PIL import Image
from scipy import ndimage

IMSIZE = 32
# The severity lists of make_cifar_c.py, copied verbatim (zoom_blur: the `end` of np.arange(1, end, 0.01))
CONSTANTS = {
    "gaussian_noise": [0.04, 0.06, .08, .09, .10],
    "shot_noise": [500, 250, 100, 75, 50],
    "impulse_noise": [.01, .02, .03, .05, .07],
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
    "zoom_blur": [1.06, 1.11, 1.16, 1.21, 1.26],
    "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9), (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85), (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
    "fog": [(.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
    "brightness": [.05, .1, .15, .2, .3],
    "contrast": [.75, .5, .4, .3, 0.15],
    "elastic_transform": [(IMSIZE * 0, IMSIZE * 0, IMSIZE * 0.08), (IMSIZE * 0.05, IMSIZE * 0.2, IMSIZE * 0.07),
                          (IMSIZE * 0.08, IMSIZE * 0.06, IMSIZE * 0.06), (IMSIZE * 0.1, IMSIZE * 0.04, IMSIZE * 0.05),
                          (IMSIZE * 0.1, IMSIZE * 0.03, IMSIZE * 0.03)],
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],
    "jpeg_compression": [80, 65, 58, 50, 40],
}  # fmt: skip


def gaussian_noise(x: np.ndarray, c: float, normal: np.ndarray) -> np.ndarray:
    """``np.clip(x/255 + normal(scale=c), 0, 1) * 255`` with the standard normal draws ``normal`` [H, W, 3]."""
    return np.clip(x / 255.0 + c * normal, 0, 1) * 255


def shot_noise(x: np.ndarray, c: float, uniform: np.ndarray) -> np.ndarray:
    """``np.clip(poisson(x/255 * c) / c, 0, 1) * 255`` with the Poisson draw as the inverse CDF at ``uniform``."""
    lam = x / 255.0 * c
    counts = np.where(lam > 0, scipy.stats.poisson.ppf(uniform, np.maximum(lam, 1e-300)), 0.0)
    return np.clip(counts / c, 0, 1) * 255


def impulse_noise(x: np.ndarray, c: float, flip_uniform: np.ndarray, salt_uniform: np.ndarray) -> np.ndarray:
    """skimage ``random_noise(mode='s&p', amount=c)``: per value, flipped with probability c, salt or pepper 50/50."""
    out = x / 255.0
    flipped = flip_uniform < c
    salted = salt_uniform < 0.5
    out[flipped & salted] = 1.0
    out[flipped & ~salted] = 0.0
    return np.clip(out, 0, 1) * 255


def disk(radius: float, alias_blur: float) -> np.ndarray:
    """Hendrycks' ``disk``: aliased disk on a 17x17 grid (float32), smoothed by a 3x3 Gaussian (cv2.GaussianBlur)."""
    grid = np.arange(-8, 8 + 1)
    xx, yy = np.meshgrid(grid, grid)
    aliased = np.array((xx**2 + yy**2) <= radius**2, dtype=np.float32)
    aliased /= np.sum(aliased)
    taps = np.exp(-np.arange(-1, 2) ** 2 / (2 * alias_blur**2))
    taps /= taps.sum()
    smooth = ndimage.correlate1d(aliased, taps, axis=0, mode="mirror")
    return ndimage.correlate1d(smooth, taps, axis=1, mode="mirror").astype(np.float32)


def defocus_blur(x: np.ndarray, c: tuple) -> np.ndarray:
    """cv2.filter2D of every channel with ``disk(*c)``, BORDER_REFLECT_101."""
    kernel = disk(*c).astype(np.float64)
    channels = [ndimage.correlate(x[:, :, d] / 255.0, kernel, mode="mirror") for d in range(3)]
    return np.clip(np.stack(channels, axis=-1), 0, 1) * 255


def _skimage_gaussian(x: np.ndarray, sigma: float) -> np.ndarray:
    """skimage.filters.gaussian(x, sigma, multichannel=True) on a float image."""
    return ndimage.gaussian_filter(x, sigma=(sigma, sigma, 0), mode="nearest")


def glass_blur(x: np.ndarray, c: tuple, offsets: np.ndarray) -> np.ndarray:
    """The reference loop verbatim; ``offsets`` [iterations, n_h, n_w, 2] are the successive ``randint`` (dx, dy)."""
    sigma, max_delta, iterations = c
    height, width = x.shape[:2]
    x = np.uint8(_skimage_gaussian(np.array(x) / 255.0, sigma) * 255)
    for i in range(iterations):
        for hi, h in enumerate(range(height - max_delta, max_delta, -1)):
            for wi, w in enumerate(range(width - max_delta, max_delta, -1)):
                dx, dy = offsets[i, hi, wi]
                h_prime, w_prime = h + dy, w + dx
                # swap (as written in the reference: with NumPy views this copies x[h', w'] into x[h, w])
                x[h, w], x[h_prime, w_prime] = x[h_prime, w_prime], x[h, w]
    return np.clip(_skimage_gaussian(x / 255.0, sigma), 0, 1) * 255


def _shift(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """imagecorruptions' ``shift``: roll with edge replication."""
    if dx < 0:
        shifted = np.roll(image, shift=image.shape[1] + dx, axis=1)
        shifted[:, dx:] = shifted[:, dx - 1 : dx]
    elif dx > 0:
        shifted = np.roll(image, shift=dx, axis=1)
        shifted[:, :dx] = shifted[:, dx : dx + 1]
    else:
        shifted = image
    if dy < 0:
        shifted = np.roll(shifted, shift=image.shape[0] + dy, axis=0)
        shifted[dy:, :] = shifted[dy - 1 : dy, :]
    elif dy > 0:
        shifted = np.roll(shifted, shift=dy, axis=0)
        shifted[:dy, :] = shifted[dy : dy + 1, :]
    return shifted


def motion_blur_kernel(x: np.ndarray, radius: int, sigma: float, angle: float) -> np.ndarray:
    """imagecorruptions' ``_motion_blur`` (the ImageMagick-free line kernel)."""
    width = radius * 2 + 1
    kernel = np.exp(-np.arange(width) ** 2 / (2 * sigma**2)) / (np.sqrt(2 * np.pi) * sigma)
    kernel /= kernel.sum()
    point = (width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle)))
    hypot = math.hypot(point[0], point[1])
    blurred = np.zeros_like(x, dtype=np.float32)
    for i in range(width):
        dy = -math.ceil(((i * point[0]) / hypot) - 0.5)
        dx = -math.ceil(((i * point[1]) / hypot) - 0.5)
        if np.abs(dy) >= x.shape[0] or np.abs(dx) >= x.shape[1]:
            break
        blurred = blurred + kernel[i] * _shift(x, dx, dy)
    return blurred


def motion_blur(x: np.ndarray, c: tuple, angle: float) -> np.ndarray:
    """Motion blur with the line kernel, rounded to 8 bits as ImageMagick's PNG output is."""
    return np.round(np.clip(motion_blur_kernel(np.array(x), c[0], c[1], angle), 0, 255))


def clipped_zoom(img: np.ndarray, zoom_factor: float) -> np.ndarray:
    """Hendrycks' ``clipped_zoom`` (square images)."""
    h = img.shape[0]
    ch = int(np.ceil(h / zoom_factor))
    top = (h - ch) // 2
    img = ndimage.zoom(img[top : top + ch, top : top + ch], (zoom_factor, zoom_factor, 1), order=1)
    trim_top = (img.shape[0] - h) // 2
    return img[trim_top : trim_top + h, trim_top : trim_top + h]


def zoom_blur(x: np.ndarray, end: float) -> np.ndarray:
    """Mean of the image and its clipped zooms for ``np.arange(1, end, 0.01)`` (float32, as the reference)."""
    factors = np.arange(1, end, 0.01)
    x = (np.array(x) / 255.0).astype(np.float32)
    out = np.zeros_like(x)
    for zoom_factor in factors:
        out += clipped_zoom(x, zoom_factor)
    return np.clip((x + out) / (len(factors) + 1), 0, 1) * 255


def snow(x: np.ndarray, c: tuple, layer: np.ndarray, angle: float) -> np.ndarray:
    """Snow with the N(loc, scale) draws ``layer`` [H, W] and blur ``angle``; ImageMagick -> line kernel + rounding."""
    x = np.array(x, dtype=np.float32) / 255.0
    snow_layer = clipped_zoom(layer[..., np.newaxis], c[2])
    snow_layer[snow_layer < c[3]] = 0
    snow_layer = (np.clip(snow_layer.squeeze(), 0, 1) * 255).astype(np.uint8)
    snow_layer = np.round(motion_blur_kernel(snow_layer, c[4], c[5], angle)) / 255.0
    snow_layer = snow_layer[..., np.newaxis]
    gray = (0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2])[..., np.newaxis]
    x = c[6] * x + (1 - c[6]) * np.maximum(x, gray * 1.5 + 0.5)
    return np.clip(x + snow_layer + np.rot90(snow_layer, k=2), 0, 1) * 255


def frost(x: np.ndarray, c: tuple, crop_uint8: np.ndarray) -> np.ndarray:
    """``np.clip(c0 * x + c1 * frost_crop, 0, 255)`` with the RGB texture crop."""
    return np.clip(c[0] * np.array(x) + c[1] * crop_uint8, 0, 255)


def plasma_fractal(uniforms: np.ndarray, mapsize: int = 32, wibbledecay: float = 3) -> np.ndarray:
    """Hendrycks' diamond-square ``plasma_fractal`` consuming ``uniforms`` (U[0, 1)) in call order."""
    stream = iter(np.asarray(uniforms, dtype=np.float64))

    def uniform(low: float, high: float, shape: tuple) -> np.ndarray:
        draws = np.array([next(stream) for _ in range(int(np.prod(shape)))]).reshape(shape)
        return low + (high - low) * draws

    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    stepsize = mapsize
    wibble = 100

    def wibbledmean(array: np.ndarray) -> np.ndarray:
        return array / 4 + wibble * uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
        squareaccum += np.roll(squareaccum, shift=-1, axis=1)
        maparray[stepsize // 2 : mapsize : stepsize, stepsize // 2 : mapsize : stepsize] = wibbledmean(squareaccum)
        drgrid = maparray[stepsize // 2 : mapsize : stepsize, stepsize // 2 : mapsize : stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ldrsum = drgrid + np.roll(drgrid, 1, axis=0)
        lulsum = ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[0:mapsize:stepsize, stepsize // 2 : mapsize : stepsize] = wibbledmean(ldrsum + lulsum)
        tdrsum = drgrid + np.roll(drgrid, 1, axis=1)
        tulsum = ulgrid + np.roll(ulgrid, -1, axis=0)
        maparray[stepsize // 2 : mapsize : stepsize, 0:mapsize:stepsize] = wibbledmean(tdrsum + tulsum)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def fog(x: np.ndarray, c: tuple, uniforms: np.ndarray) -> np.ndarray:
    """Fog with the plasma map drawn from ``uniforms``."""
    x = np.array(x) / 255.0
    max_val = x.max()
    x += c[0] * plasma_fractal(uniforms, wibbledecay=c[1])[:32, :32][..., np.newaxis]
    return np.clip(x * max_val / (max_val + c[0]), 0, 1) * 255


def rgb2hsv(arr: np.ndarray) -> np.ndarray:
    """skimage.color.rgb2hsv."""
    out = np.empty_like(arr)
    out_v = arr.max(-1)
    delta = np.ptp(arr, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out_s = delta / out_v
        out_s[delta == 0.0] = 0.0
        idx = arr[..., 0] == out_v
        out[idx, 0] = (arr[idx, 1] - arr[idx, 2]) / delta[idx]
        idx = arr[..., 1] == out_v
        out[idx, 0] = 2.0 + (arr[idx, 2] - arr[idx, 0]) / delta[idx]
        idx = arr[..., 2] == out_v
        out[idx, 0] = 4.0 + (arr[idx, 0] - arr[idx, 1]) / delta[idx]
    out_h = (out[..., 0] / 6.0) % 1.0
    out_h[delta == 0.0] = 0.0
    out[..., 0], out[..., 1], out[..., 2] = out_h, out_s, out_v
    out[np.isnan(out)] = 0
    return out


def hsv2rgb(arr: np.ndarray) -> np.ndarray:
    """skimage.color.hsv2rgb."""
    hi = np.floor(arr[..., 0] * 6)
    f = arr[..., 0] * 6 - hi
    p = arr[..., 2] * (1 - arr[..., 1])
    q = arr[..., 2] * (1 - f * arr[..., 1])
    t = arr[..., 2] * (1 - (1 - f) * arr[..., 1])
    v = arr[..., 2]
    hi = np.stack([hi, hi, hi], axis=-1).astype(np.uint8) % 6
    table = [np.stack(s, axis=-1) for s in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))]
    return np.choose(hi, np.stack(table))


def brightness(x: np.ndarray, c: float) -> np.ndarray:
    """HSV V + c."""
    hsv = rgb2hsv(np.array(x) / 255.0)
    hsv[:, :, 2] = np.clip(hsv[:, :, 2] + c, 0, 1)
    return np.clip(hsv2rgb(hsv), 0, 1) * 255


def contrast(x: np.ndarray, c: float) -> np.ndarray:
    """Scale around the per-channel mean."""
    x = np.array(x) / 255.0
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def _reflect101(index: np.ndarray, size: int) -> np.ndarray:
    """cv2 BORDER_REFLECT_101 index folding."""
    period = 2 * size - 2
    folded = np.mod(index, period)
    return np.where(folded < size, folded, period - folded)


def warp_affine_reflect101(image: np.ndarray, m: np.ndarray) -> np.ndarray:
    """cv2.warpAffine(image, m, INTER_LINEAR, BORDER_REFLECT_101) as OpenCV <= 4.10 computes it (fixed point)."""
    height, width = image.shape[:2]
    d = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    d = 1.0 / d if d != 0 else 0.0
    a11, a22, a12, a21 = m[1, 1] * d, m[0, 0] * d, -m[0, 1] * d, -m[1, 0] * d
    b1 = -a11 * m[0, 2] - a12 * m[1, 2]
    b2 = -a21 * m[0, 2] - a22 * m[1, 2]
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    fx = (np.rint((a12 * ys + b1) * 1024) + 16 + np.rint(a11 * xs * 1024)).astype(np.int64) >> 5
    fy = (np.rint((a22 * ys + b2) * 1024) + 16 + np.rint(a21 * xs * 1024)).astype(np.int64) >> 5
    x0, y0 = fx >> 5, fy >> 5
    wx, wy = ((fx & 31) / 32.0)[..., None], ((fy & 31) / 32.0)[..., None]
    c0, c1 = _reflect101(x0, width), _reflect101(x0 + 1, width)
    r0, r1 = _reflect101(y0, height), _reflect101(y0 + 1, height)
    top = image[r0, c0] * (1 - wx) + image[r0, c1] * wx
    bottom = image[r1, c0] * (1 - wx) + image[r1, c1] * wx
    return (top * (1 - wy) + bottom * wy).astype(np.float32)


def elastic_transform(
    image: np.ndarray, c: tuple, jitter: np.ndarray, noise_x: np.ndarray, noise_y: np.ndarray
) -> np.ndarray:
    """Elastic transform with affine ``jitter`` [3, 2] ~ U(-c2, c2) and displacement draws ~ U(-1, 1) [H, W]."""
    image = np.array(image, dtype=np.float32) / 255.0
    shape = image.shape
    center_square = np.float32(shape[:2]) // 2
    square_size = min(shape[:2]) // 3
    pts1 = np.float32(
        [
            center_square + square_size,
            [center_square[0] + square_size, center_square[1] - square_size],
            center_square - square_size,
        ]
    )
    pts2 = pts1 + jitter.astype(np.float32)
    design = np.concatenate([pts1.astype(np.float64), np.ones((3, 1))], axis=1)
    m = np.linalg.solve(design, pts2.astype(np.float64)).T  # cv2.getAffineTransform
    image = warp_affine_reflect101(image, m)
    dx = (ndimage.gaussian_filter(noise_x, c[1], mode="reflect", truncate=3) * c[0]).astype(np.float32)
    dy = (ndimage.gaussian_filter(noise_y, c[1], mode="reflect", truncate=3) * c[0]).astype(np.float32)
    dx, dy = dx[..., np.newaxis], dy[..., np.newaxis]
    x, y, z = np.meshgrid(np.arange(shape[1]), np.arange(shape[0]), np.arange(shape[2]))
    indices = np.reshape(y + dy, (-1, 1)), np.reshape(x + dx, (-1, 1)), np.reshape(z, (-1, 1))
    return np.clip(ndimage.map_coordinates(image, indices, order=1, mode="reflect").reshape(shape), 0, 1) * 255


def pixelate(x: np.ndarray, c: float) -> np.ndarray:
    """PIL BOX down to int(32 c) and back."""
    image = Image.fromarray(x).resize((int(32 * c), int(32 * c)), Image.BOX)
    return np.asarray(image.resize((32, 32), Image.BOX))


def jpeg_compression(x: np.ndarray, quality: int) -> np.ndarray:
    """PIL JPEG round trip."""
    output = io.BytesIO()
    Image.fromarray(x).save(output, "JPEG", quality=quality)
    return np.asarray(Image.open(output))


def _hwc(a: np.ndarray) -> np.ndarray:
    """CHW -> HWC (the random fields are drawn channel-first, like the torch kernels use them)."""
    return a.transpose(1, 2, 0)


def apply_reference(name: str, severity: int, images_uint8: np.ndarray, fields: dict) -> np.ndarray:
    """The transcribed reference applied image by image, as make_cifar_c.py does, and cast with ``np.uint8``.

    ``images_uint8``: [B, H, W, 3]; ``fields``: the batched random fields of ``ftta_core.corruptions`` (as returned
    by ``registry.draw_fields``; torch CPU tensors or arrays, image ``b`` at index ``b``), empty for deterministic
    corruptions. Returns uint8 [B, H, W, 3].
    """
    c = CONSTANTS[name][severity - 1]
    outs = []
    for b, image in enumerate(images_uint8):
        f = {k: np.asarray(v[b]) for k, v in fields.items()}
        if name == "gaussian_noise":
            out = gaussian_noise(image, c, _hwc(f["normal"]).astype(np.float64))
        elif name == "shot_noise":
            out = shot_noise(image, c, _hwc(f["uniform"]))
        elif name == "impulse_noise":
            out = impulse_noise(image, c, _hwc(f["flip_uniform"]), _hwc(f["salt_uniform"]))
        elif name == "defocus_blur":
            out = defocus_blur(image, c)
        elif name == "glass_blur":
            out = glass_blur(image, c, f["offsets"])
        elif name == "motion_blur":
            out = motion_blur(image, c, float(f["angle"]))
        elif name == "zoom_blur":
            out = zoom_blur(image, c)
        elif name == "snow":
            out = snow(image, c, f["layer"].astype(np.float64), float(f["angle"]))
        elif name == "frost":
            out = frost(image, c, np.round(_hwc(f["frost"]) * 255).astype(np.uint8))
        elif name == "fog":
            out = fog(image, c, f["uniforms"])
        elif name == "elastic_transform":
            out = elastic_transform(image, c, f["jitter"], f["noise_x"], f["noise_y"])
        else:
            out = globals()[name](image, c)
        outs.append(np.uint8(out))
    return np.stack(outs)
