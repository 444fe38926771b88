"""Synthetic Cityscapes-style street scenes with all 19 evaluated classes — road, sidewalk, building,
wall, fence, vegetation, terrain, sky; thin and small ones (poles and traffic lights 1-6 px wide,
signs, persons, riders on bicycles and motorcycles, bicycles of thin rings and bars); cars, trucks,
buses and trams — with textures, shading and noise, written as ``leftImg8bit`` and
``gtFine_labelIds`` PNGs. Colours overlap between classes (grey buildings, roads, sidewalks and poles;
cars of any colour), so a model must use shape and context. Painters draw from one generator in a
fixed order, so a seed gives the same scene."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from upzoo.data.cache import cached
from upzoo.data.cityscapes import LABELS
from upzoo.data.io import write_png

__all__ = ["street_scene", "ensure_synthetic_cityscapes", "OBJECT_KINDS"]

#: Cityscapes label ids by class name (what the label PNGs hold).
LABEL_ID = {label.name: label.id for label in LABELS}
BICYCLE = LABEL_ID["bicycle"]
BUILDING = LABEL_ID["building"]
BUS = LABEL_ID["bus"]
CAR = LABEL_ID["car"]
FENCE = LABEL_ID["fence"]
MOTORCYCLE = LABEL_ID["motorcycle"]
PERSON = LABEL_ID["person"]
POLE = LABEL_ID["pole"]
RIDER = LABEL_ID["rider"]
ROAD = LABEL_ID["road"]
SIDEWALK = LABEL_ID["sidewalk"]
SKY = LABEL_ID["sky"]
TERRAIN = LABEL_ID["terrain"]
TRAFFIC_LIGHT = LABEL_ID["traffic light"]
TRAFFIC_SIGN = LABEL_ID["traffic sign"]
TRAIN = LABEL_ID["train"]
TRUCK = LABEL_ID["truck"]
VEGETATION = LABEL_ID["vegetation"]
WALL = LABEL_ID["wall"]


# -- street scenes -----------------------------------------------------------------------------------
def _smooth_noise(rng: np.random.Generator, h: int, w: int, cell: int) -> np.ndarray:
    """Low-frequency noise in [-1, 1]: a coarse random grid, bilinearly upsampled."""
    gh, gw = h // cell + 2, w // cell + 2
    grid = rng.uniform(-1, 1, (gh, gw))
    ys, xs = np.linspace(0, gh - 1.001, h), np.linspace(0, gw - 1.001, w)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = grid[y0][:, x0] * (1 - fx) + grid[y0][:, x0 + 1] * fx
    bottom = grid[y0 + 1][:, x0] * (1 - fx) + grid[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


class _Scene:
    """A street scene being painted: the image, its label ids and the geometry the painters share.
    Painters draw from one generator in a fixed order, so a seed gives the same scene."""

    def __init__(self, rng: np.random.Generator, height: int, width: int) -> None:
        self.rng, self.h, self.w = rng, height, width
        self.yy, self.xx = np.mgrid[0:height, 0:width]
        self.img = np.zeros((height, width, 3), np.float32)
        self.lab = np.full((height, width), SKY, np.uint8)  # sky
        self.horizon = int(height * rng.uniform(0.36, 0.5))

    def paint(self, mask: np.ndarray, color, label: int, texture: float = 0.0, cell: int = 4) -> None:
        color = np.asarray(color, np.float32)
        shade = 1.0 + texture * _smooth_noise(self.rng, self.h, self.w, cell)[mask] if texture else 1.0
        self.img[mask] = np.clip(color[None, :] * np.atleast_1d(shade)[:, None], 0, 255)
        self.lab[mask] = label

    def ground_y(self, t: float) -> float:
        return self.horizon + t * (self.h - self.horizon)


def _sky(s: _Scene) -> None:
    """A vertical gradient with soft clouds."""
    t = (s.yy / max(s.horizon, 1))[..., None]
    sky_top, sky_low = s.rng.uniform([40, 90, 150], [90, 140, 220]), s.rng.uniform([150, 180, 210], [210, 220, 245])
    s.img[:] = sky_top * (1 - t) + sky_low * t
    clouds = np.clip(_smooth_noise(s.rng, s.h, s.w, max(8, s.w // 12)), 0, 1)[..., None]
    s.img[:] = s.img * (1 - 0.6 * clouds) + 235 * 0.6 * clouds


def _buildings(s: _Scene) -> None:
    """Buildings along the horizon, with window grids; gaps let sky and trees through."""
    rng, yy, xx, w = s.rng, s.yy, s.xx, s.w
    x = int(rng.integers(-w // 10, 0))
    while x < w:
        bw = max(1, int(rng.uniform(0.08, 0.25) * w))
        if rng.random() < 0.85:
            top = int(s.horizon - rng.uniform(0.08, 0.34) * s.h)
            base = rng.uniform(60, 190)
            color = base * rng.uniform(0.85, 1.15, 3)
            m = (yy >= top) & (yy < s.horizon + 2) & (xx >= x) & (xx < x + bw)
            s.paint(m, color, BUILDING, texture=0.08)
            step_y, step_x = int(rng.integers(6, 12)), int(rng.integers(6, 12))
            win = m & ((yy - top) % step_y >= step_y // 2) & ((xx - x) % step_x >= step_x // 2) & (yy < s.horizon - 3)
            s.img[win] = s.img[win] * rng.uniform(0.45, 0.8) + rng.uniform(0, 40)
        x += bw + int(rng.integers(0, w // 20 + 1))


def _vegetation(s: _Scene) -> None:
    """Trees and hedges."""
    rng, yy, xx = s.rng, s.yy, s.xx
    for _ in range(int(rng.integers(1, 5))):
        cx, r = rng.uniform(0, s.w), rng.uniform(0.04, 0.12) * s.w
        cy = s.horizon - r * rng.uniform(0.3, 1.0)
        crown = np.zeros((s.h, s.w), bool)
        for _ in range(5):
            ox, oy, rr = rng.normal(0, r / 2), rng.normal(0, r / 3), r * rng.uniform(0.5, 0.9)
            crown |= (xx - cx - ox) ** 2 + (yy - cy - oy) ** 2 < rr**2
        s.paint(crown, rng.uniform([40, 90, 20], [90, 150, 60]), VEGETATION, texture=0.35, cell=2)
        trunk = (np.abs(xx - cx) < max(1, r / 8)) & (yy > cy) & (yy < s.horizon + 2)
        s.paint(trunk, (90, 70, 50), VEGETATION)


def _ground(s: _Scene) -> None:
    """Road (a trapezoid to a vanishing point), sidewalks and terrain; sets the road geometry."""
    rng, yy, xx, w, horizon = s.rng, s.yy, s.xx, s.w, s.horizon
    below = yy >= horizon
    s.tt = tt = np.clip((yy - horizon) / max(s.h - horizon, 1), 0, 1)
    s.vx = vx = rng.uniform(0.35, 0.65) * w
    s.left = left = vx + (rng.uniform(-0.25, 0.2) * w - vx) * tt
    s.right = right = vx + (rng.uniform(0.8, 1.25) * w - vx) * tt
    s.walk = walk = rng.uniform(0.12, 0.25) * w * tt
    terrain = below & ((xx < left - walk) | (xx > right + walk))
    s.paint(terrain, rng.uniform([80, 110, 50], [140, 170, 90]), TERRAIN, texture=0.3, cell=2)
    sidewalk = below & ~terrain & ((xx < left) | (xx > right))
    s.paint(sidewalk, rng.uniform(120, 190) * rng.uniform(0.9, 1.1, 3), SIDEWALK, texture=0.06)
    tiles = sidewalk & (((yy - horizon) % 7 == 0) | (((xx - vx) / np.maximum(tt, 0.05)).astype(int) % 23 == 0))
    s.img[tiles] *= 0.8
    road = below & (xx >= left) & (xx <= right)
    s.paint(road, rng.uniform(55, 110) * rng.uniform(0.95, 1.05, 3), ROAD, texture=0.05)
    dashes = road & (np.abs(xx - (vx + (0.5 * (left + right) - vx))) < 0.006 * w * (1 + 4 * tt)) & ((yy // 6) % 3 == 0)
    s.img[dashes] = 230


def _fence_or_wall(s: _Scene) -> None:
    """A fence or a wall between sidewalk and terrain on one side (sometimes)."""
    rng, yy, xx = s.rng, s.yy, s.xx
    if rng.random() < 0.85:
        side_left = rng.random() < 0.5
        edge = (s.left - s.walk) if side_left else (s.right + s.walk)
        band = (yy >= s.horizon) & (np.abs(xx - edge) < 0.05 * s.w * (0.3 + s.tt))
        band &= (yy < s.horizon + (s.h - s.horizon) * 0.9) & (s.tt > 0.05)
        if rng.random() < 0.5:
            s.paint(band, rng.uniform(90, 170) * rng.uniform(0.9, 1.1, 3), WALL, texture=0.1)  # wall
        else:
            slats = band & ((xx // 3) % 3 == 0)
            s.paint(slats, rng.uniform([100, 80, 60], [170, 150, 120]), FENCE)  # fence


def _pole(s: _Scene) -> None:
    """A pole on a sidewalk edge carrying a traffic sign or a traffic light."""
    rng, yy, xx, w, h = s.rng, s.yy, s.xx, s.w, s.h
    t_ = rng.uniform(0.2, 0.9)
    gy = s.ground_y(t_)
    row = min(int(gy), h - 1)
    side = rng.random() < 0.5
    edge_x = (s.vx + (s.left[row, 0] - s.vx)) if side else (s.vx + (s.right[row, 0] - s.vx))
    px = edge_x - 0.5 * s.walk[row, 0] if side else edge_x + 0.5 * s.walk[row, 0]
    ph = (0.25 + 0.4 * t_) * h
    half = max(0.5, 0.004 * w * (0.3 + t_))  # 1-6 px wide at 256-512 px
    s.paint((np.abs(xx - px) <= half) & (yy <= gy) & (yy >= gy - ph), rng.uniform(90, 160) * np.ones(3), POLE)
    top, size = gy - ph, max(2.0, 0.02 * w * (0.4 + t_))
    if rng.random() < 0.5:  # traffic sign: disc or square
        color = [(220, 30, 30), (240, 240, 240), (30, 80, 200), (240, 200, 20)][int(rng.integers(0, 4))]
        if rng.random() < 0.5:
            sign = (xx - px) ** 2 + (yy - top) ** 2 < size**2
        else:
            sign = (np.abs(xx - px) < size) & (np.abs(yy - top) < size)
        s.paint(sign, color, TRAFFIC_SIGN)
        return
    box = (np.abs(xx - px) < size * 0.6) & (yy > top - size * 1.6) & (yy < top + size * 1.6)  # traffic light
    s.paint(box, (35, 35, 35), TRAFFIC_LIGHT)
    lit = int(rng.integers(0, 3))
    for k, color in enumerate([(230, 40, 40), (240, 180, 30), (40, 220, 80)]):
        lamp = (xx - px) ** 2 + (yy - (top - size + k * size)) ** 2 < (size * 0.35) ** 2
        s.img[lamp] = np.asarray(color) * (1.0 if k == lit else 0.3)


def _car(s: _Scene, t_: float) -> None:
    rng, yy, xx = s.rng, s.yy, s.xx
    gy = s.ground_y(t_)
    row = min(int(gy), s.h - 1)
    l, r = s.left[row, 0], s.right[row, 0]
    cw = (0.12 + 0.3 * t_) * s.w
    cx = rng.uniform(l + 0.1 * cw, max(l + 0.1 * cw + 1, r - 1.1 * cw))
    ch = cw * rng.uniform(0.45, 0.6)
    body = (xx >= cx) & (xx < cx + cw) & (yy < gy - 0.1 * ch) & (yy >= gy - 0.6 * ch)
    cabin = (xx >= cx + 0.2 * cw) & (xx < cx + 0.8 * cw) & (yy < gy - 0.55 * ch) & (yy >= gy - ch)
    s.paint(body | cabin, rng.uniform(20, 235, 3), CAR, texture=0.05)
    glass = cabin & (yy > gy - 0.93 * ch) & (xx > cx + 0.26 * cw) & (xx < cx + 0.74 * cw)
    s.img[glass] = s.img[glass] * 0.3 + np.asarray([60, 80, 100]) * 0.7
    for wx in (cx + 0.2 * cw, cx + 0.8 * cw):
        wheel = (xx - wx) ** 2 + (yy - (gy - 0.12 * ch)) ** 2 < (0.13 * cw) ** 2
        s.paint(wheel, (20, 20, 20), CAR)


def _person(s: _Scene, t_: float) -> None:
    rng, yy, xx = s.rng, s.yy, s.xx
    gy = s.ground_y(t_)
    row = min(int(gy), s.h - 1)
    l, r = s.left[row, 0], s.right[row, 0]
    on_left = rng.random() < 0.5
    wk = s.walk[row, 0]
    px = (l - rng.uniform(0.2, 0.8) * wk) if on_left else (r + rng.uniform(0.2, 0.8) * wk)
    ph = (0.16 + 0.4 * t_) * s.h
    pw = ph * 0.3
    legs = (np.abs(xx - px) < pw * 0.35) & (yy <= gy) & (yy > gy - 0.45 * ph) & (np.abs(xx - px) > pw * 0.06)
    torso = (np.abs(xx - px) < pw * 0.5) & (yy <= gy - 0.4 * ph) & (yy > gy - 0.82 * ph)
    head = (xx - px) ** 2 + (yy - (gy - 0.9 * ph)) ** 2 < (0.1 * ph) ** 2
    s.paint(legs, rng.uniform(20, 120, 3), PERSON)
    s.paint(torso, rng.uniform(20, 235, 3), PERSON, texture=0.1)
    s.paint(head, rng.uniform([150, 100, 70], [240, 200, 170]), PERSON)


def _vehicle(s: _Scene, t_: float, label: int) -> None:
    """Truck (27: cab and cargo box), bus (28: long, tall, a band of windows) on the road."""
    rng, yy, xx = s.rng, s.yy, s.xx
    gy = s.ground_y(t_)
    row = min(int(gy), s.h - 1)
    l, r = s.left[row, 0], s.right[row, 0]
    vw = (0.2 + 0.4 * t_) * s.w
    vx = rng.uniform(l, max(l + 1, r - vw))
    vh = vw * rng.uniform(0.5, 0.7)
    if label == 28:  # bus: one tall box, a long row of windows, bright livery
        body = (xx >= vx) & (xx < vx + vw) & (yy < gy - 0.08 * vh) & (yy >= gy - vh)
        s.paint(body, [(230, 190, 30), (200, 40, 40), (235, 235, 235)][int(rng.integers(0, 3))], BUS, texture=0.04)
        band = body & (yy > gy - 0.85 * vh) & (yy < gy - 0.55 * vh) & (((xx - vx) // max(2, int(vw / 9))) % 2 == 0)
        s.img[band] = (50, 70, 90)
    else:  # truck: a cab in front of a taller cargo box
        cab = (xx >= vx) & (xx < vx + 0.3 * vw) & (yy < gy - 0.08 * vh) & (yy >= gy - 0.65 * vh)
        box = (xx >= vx + 0.32 * vw) & (xx < vx + vw) & (yy < gy - 0.15 * vh) & (yy >= gy - vh)
        s.paint(cab, rng.uniform(40, 200, 3), TRUCK, texture=0.05)
        s.paint(box, rng.uniform(170, 240) * np.ones(3), TRUCK, texture=0.03)
    for wx in (vx + 0.15 * vw, vx + 0.85 * vw):
        wheel = (xx - wx) ** 2 + (yy - (gy - 0.08 * vh)) ** 2 < (0.08 * vw) ** 2
        s.paint(wheel, (20, 20, 20), label)


def _train(s: _Scene) -> None:
    """A tram (31) across the scene just below the horizon: long, a stripe, windows, a pantograph."""
    rng, yy, xx = s.rng, s.yy, s.xx
    gy = s.ground_y(rng.uniform(0.08, 0.2))
    th, x0 = rng.uniform(0.12, 0.18) * s.h, rng.uniform(-0.2, 0.3) * s.w
    x1 = x0 + rng.uniform(0.5, 0.9) * s.w
    body = (xx >= x0) & (xx < x1) & (yy < gy) & (yy >= gy - th)
    s.paint(body, rng.uniform([120, 140, 170], [200, 210, 240]), TRAIN, texture=0.03)
    s.img[body & (yy > gy - 0.35 * th) & (yy < gy - 0.22 * th)] = (200, 40, 40)
    windows = body & (yy > gy - 0.85 * th) & (yy < gy - 0.5 * th) & (((xx - x0) // max(2, int(th / 2))) % 2 == 0)
    s.img[windows] = (40, 50, 70)
    mid = 0.5 * (x0 + x1)
    s.paint(
        (np.abs(xx - mid) < 0.5 + 0.3 * th)
        & (yy < gy - th)
        & (yy >= gy - 1.4 * th)
        & (np.abs(yy - (gy - th - 0.4 * th * np.abs(xx - mid) / max(1, 0.3 * th))) < 1.0),
        (40, 40, 40),
        TRAIN,
    )


def _two_wheeler(s: _Scene, t_: float, label: int, ridden: bool) -> None:
    """A bicycle (33: thin rings and frame) or motorcycle (32: solid wheels and body) on the road's
    edge, with a rider (25) when ``ridden``."""
    rng, yy, xx = s.rng, s.yy, s.xx
    gy = s.ground_y(t_)
    row = min(int(gy), s.h - 1)
    side = rng.random() < 0.5
    bx = s.left[row, 0] + rng.uniform(0.02, 0.2) * s.w if side else s.right[row, 0] - rng.uniform(0.05, 0.25) * s.w
    size = (0.07 + 0.14 * t_) * s.w
    r = 0.28 * size
    wheels = [(bx, gy - r), (bx + size, gy - r)]
    thick = max(0.8, 0.06 * r)
    parts = np.zeros((s.h, s.w), bool)
    for wx, wy in wheels:
        d = np.hypot(xx - wx, yy - wy)
        parts |= (np.abs(d - r) <= thick) if label == BICYCLE else (d <= r)
    if label == 33:  # frame: two thin bars
        for y0, y1 in ((gy - r, gy - 2.2 * r), (gy - 2.2 * r, gy - 2.2 * r)):
            on_bar = np.abs(yy - (y0 + (y1 - y0) * (xx - bx) / size)) <= thick
            parts |= on_bar & (xx >= bx) & (xx <= bx + size)
        color = rng.uniform(20, 230, 3)
    else:
        parts |= (xx >= bx + 0.1 * size) & (xx <= bx + 0.9 * size) & (yy <= gy - 0.9 * r) & (yy >= gy - 2.3 * r)
        color = rng.uniform(10, 120, 3)
    s.paint(parts, color, label)
    if ridden:
        px, ph = bx + 0.45 * size, 1.6 * size
        top = gy - 2.1 * r
        torso = (np.abs(xx - px) < 0.12 * ph) & (yy <= top) & (yy > top - 0.45 * ph)
        head = (xx - px) ** 2 + (yy - (top - 0.55 * ph)) ** 2 < (0.1 * ph) ** 2
        leg = (np.abs(xx - (px + 0.1 * size)) < 0.05 * ph) & (yy <= gy - r) & (yy > top)
        s.paint(torso | leg, rng.uniform(20, 235, 3), RIDER, texture=0.1)
        s.paint(head, rng.uniform([150, 100, 70], [240, 200, 170]), RIDER)


#: the object kinds a scene can hold; ``street_scene(force=k)`` guarantees one of kind ``k``
OBJECT_KINDS = ("car", "person", "truck", "bus", "train", "bicycle", "motorcycle", "rider", "pole")


def _objects(rng: np.random.Generator, force: str | None) -> list[tuple[str, float]]:
    counts = {
        "car": int(rng.integers(1, 4)),
        "person": int(rng.integers(1, 4)),
        "truck": int(rng.random() < 0.3),
        "bus": int(rng.random() < 0.3),
        "bicycle": int(rng.integers(0, 3)),
        "motorcycle": int(rng.integers(0, 2)),
        "rider": int(rng.integers(0, 3)),
    }
    if force in counts:
        counts[force] = max(1, counts[force])
    objects = [(kind, rng.uniform(0.15, 0.95)) for kind, n in counts.items() for _ in range(n)]
    return sorted(objects, key=lambda o: o[1])  # far to near


def _place(s: _Scene, kind: str, t_: float) -> None:
    if kind in ("car", "person"):
        (_car if kind == "car" else _person)(s, t_)
    elif kind in ("truck", "bus"):
        _vehicle(s, t_, TRUCK if kind == "truck" else BUS)
    elif kind == "rider":
        _two_wheeler(s, t_, MOTORCYCLE if s.rng.random() < 0.5 else BICYCLE, ridden=True)
    else:
        _two_wheeler(s, t_, BICYCLE if kind == "bicycle" else MOTORCYCLE, ridden=False)


def street_scene(
    rng: np.random.Generator, height: int, width: int, force: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic street scene: ``(H, W, 3)`` uint8 RGB and ``(H, W)`` uint8 Cityscapes label ids.
    All 19 evaluated classes occur across scenes; ``force`` (one of :data:`OBJECT_KINDS`) makes
    sure this scene holds that kind of object."""
    s = _Scene(rng, height, width)
    for painter in (_sky, _buildings, _vegetation, _ground, _fence_or_wall):
        painter(s)
    if force == "train" or rng.random() < 0.5:
        _train(s)
    for _ in range(int(rng.integers(1, 4))):
        _pole(s)
    for kind, t_ in _objects(rng, force):
        _place(s, kind, t_)
    light = 1.0 + 0.25 * _smooth_noise(rng, s.h, s.w, max(16, s.w // 4)) + rng.uniform(-0.15, 0.15)
    img = s.img * light[..., None] + rng.normal(0, rng.uniform(3, 8), s.img.shape)  # light, shadow, noise
    return np.clip(img, 0, 255).astype(np.uint8), s.lab


def ensure_synthetic_cityscapes(
    cache_dir: str | Path | None = None,
    *,
    train: int = 64,
    val: int = 16,
    size: Sequence[int] = (256, 512),
    seed: int = 0,
) -> Path:
    """The embedded Cityscapes-style set in the official layout (city ``synthcity``), generated once.

    >>> root = ensure_synthetic_cityscapes(train=2, val=1, size=(64, 128))  # doctest: +SKIP
    """
    height, width = int(size[0]), int(size[1])
    params = {"train": train, "val": val, "size": [height, width], "seed": seed, "version": 3}

    def write(root: Path) -> None:
        for split, count in (("train", train), ("val", val)):
            for i in range(count):
                rng = np.random.default_rng([seed, 0 if split == "train" else 1, i])
                # every kind of object in turn: each split holds all 19 classes once it has 9 scenes
                image, labels = street_scene(rng, height, width, force=OBJECT_KINDS[i % len(OBJECT_KINDS)])
                stem = f"synthcity_{i:06d}_000019"
                write_png(root / "leftImg8bit" / split / "synthcity" / f"{stem}_leftImg8bit.png", image)
                write_png(root / "gtFine" / split / "synthcity" / f"{stem}_gtFine_labelIds.png", labels)

    return cached("cityscapes-synthetic", params, cache_dir, write)
