"""Generate the CIFAR-10-C cache (15 corruptions x seeds) with one process per (corruption, seed)."""
import sys, time
from multiprocessing import Pool

def one(args):
    import torch
    torch.set_num_threads(1)
    from ftta_core.data.cifar import load_cifar10
    from ftta_core.stream import CorruptedDomains
    from ftta_core.data.root import cache_dir
    name, seed = args
    t0 = time.time()
    d = CorruptedDomains(load_cifar10("test"), [name], 5, seed=seed, cache_dir=cache_dir() / "corrupted")
    d.domain_images(0)
    return name, seed, round(time.time() - t0, 1)

if __name__ == "__main__":
    from ftta_core.corruptions import CORRUPTIONS
    seeds = [int(s) for s in sys.argv[2:]]
    jobs = [(c, s) for s in seeds for c in CORRUPTIONS]
    t0 = time.time()
    with Pool(int(sys.argv[1])) as pool:
        for r in pool.imap_unordered(one, jobs):
            pass
    print(f"pregen {len(jobs)} domains in {time.time() - t0:.0f} s", flush=True)
