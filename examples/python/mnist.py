#!/usr/bin/env python3
"""A plain PyTorch training script in the shape of pytorch/examples' MNIST
one (a two-convolution network, NLL loss, a StepLR schedule, a train and a
test loop), whose only bigbatch line is the optimizer's:

    optimizer = bigbatch.optim.LAMB(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

where that script has torch.optim.Adadelta. It reads MNIST or Fashion-MNIST
through torchvision (downloaded into --data, or, offline, the gzipped IDX
files of --idx, e.g. Debian's /usr/share/datasets/fashion-mnist).
docs/python.md shows what it reaches.
"""
import argparse
import gzip
import pathlib
import shutil

import torch
import torch.nn.functional as F
from torch import nn
from torchvision import datasets, transforms

import bigbatch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, loader, optimizer, epoch):
    model.train()
    for batch, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch % args.log_interval == 0:
            print(f"epoch {epoch} [{batch * len(data)}/{len(loader.dataset)}] loss {loss.item():.4f}")


def test(model, device, loader):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(loader.dataset)
    print(f"test: average loss {loss / n:.4f}, accuracy {correct}/{n} ({100.0 * correct / n:.1f}%)")
    return correct / n


def offline_copy(idx, data, name):
    """torchvision's layout (DATA/NAME/raw/, unzipped) from gzipped IDX files."""
    raw = pathlib.Path(data) / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for gz in pathlib.Path(idx).glob("*-ubyte.gz"):
        target = raw / gz.name[:-3]
        if not target.exists():
            with gzip.open(gz) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST example with bigbatch's LAMB")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--gamma", type=float, default=0.7, help="learning-rate step gamma")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--dataset", choices=["mnist", "fashion"], default="mnist")
    parser.add_argument("--data", default="../data", help="torchvision's data folder")
    parser.add_argument("--idx", help="a folder of gzipped IDX files to use instead of downloading")
    parser.add_argument("--train-size", type=int, help="train on the first N examples only")
    parser.add_argument("--test-size", type=int, help="test on the first N examples only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dataset = datasets.MNIST if args.dataset == "mnist" else datasets.FashionMNIST
    if args.idx:
        offline_copy(args.idx, args.data, dataset.__name__)
    normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = dataset(args.data, train=True, download=not args.idx, transform=normalize)
    test_set = dataset(args.data, train=False, download=not args.idx, transform=normalize)
    if args.train_size:
        train_set = torch.utils.data.Subset(train_set, range(args.train_size))
    if args.test_size:
        test_set = torch.utils.data.Subset(test_set, range(args.test_size))
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size)

    model = Net().to(device)
    optimizer = bigbatch.optim.LAMB(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        accuracy = test(model, device, test_loader)
        scheduler.step()
    return accuracy


if __name__ == "__main__":
    main()
