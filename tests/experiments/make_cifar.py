#!/usr/bin/env python3
"""Writes CIFAR-format binary files of a learnable synthetic task, for tests
and benchmarks (no data can be downloaded where they run).

Each class is a smooth random colour pattern; an example is its class's
pattern shifted by up to 4 pixels, maybe mirrored, plus pixel noise: the
kind of variation CIFAR's augmentation covers. The record layout is the
binary version's: CIFAR-10, one label byte then 1024 red, 1024 green and
1024 blue bytes (data_batch_1..5.bin, test_batch.bin); CIFAR-100, a coarse
and a fine label byte first (train.bin, test.bin; coarse = fine // 5).

  make_cifar.py OUT [--classes 10|100] [--train N] [--test N] [--seed S]
"""
import argparse
import os

import numpy as np


def examples(rng, patterns, n):
    classes = len(patterns)
    labels = rng.integers(0, classes, n)
    images = np.empty((n, 3, 32, 32), np.uint8)
    for i, y in enumerate(labels):
        img = np.roll(patterns[y], tuple(rng.integers(-4, 5, 2)), axis=(1, 2))
        if rng.integers(0, 2):
            img = img[:, :, ::-1]
        images[i] = np.clip(img + rng.normal(0, 24, img.shape), 0, 255).astype(np.uint8)
    return labels, images


def write(path, label_bytes, images):
    n = images.shape[0]
    records = np.concatenate([label_bytes.reshape(n, -1).astype(np.uint8), images.reshape(n, -1)], axis=1)
    with open(path, "wb") as f:
        f.write(records.tobytes())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--classes", type=int, default=10, choices=(10, 100))
    p.add_argument("--train", type=int, default=2000, help="training records in all (split over 5 files for CIFAR-10)")
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    coarse = rng.normal(128, 60, (a.classes, 3, 4, 4))
    patterns = np.clip(coarse.repeat(8, axis=2).repeat(8, axis=3), 0, 255)
    os.makedirs(a.out, exist_ok=True)
    train_y, train_x = examples(rng, patterns, a.train)
    test_y, test_x = examples(rng, patterns, a.test)
    if a.classes == 10:
        for k, part in enumerate(np.array_split(np.arange(a.train), 5)):
            write(os.path.join(a.out, "data_batch_%d.bin" % (k + 1)), train_y[part], train_x[part])
        write(os.path.join(a.out, "test_batch.bin"), test_y, test_x)
    else:
        for name, y, x in (("train.bin", train_y, train_x), ("test.bin", test_y, test_x)):
            write(os.path.join(a.out, name), np.stack([y // 5, y], axis=1), x)


if __name__ == "__main__":
    main()
