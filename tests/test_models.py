"""Models and source training: shapes, the ResNet-8 of FedTSA, reproducible training, checkpoints."""
import numpy as np
import pytest
import torch

from ftta_core.data.base import ImageArray
from ftta_core.models import build_model
from ftta_core.training import SOURCE_MODELS, SourceSpec, augment_batch, load_source_model, train_model
from ftta_core.rng import torch_generator


def test_resnet8_matches_the_fedtsa_description():
    m = build_model("resnet8")
    assert sum(p.numel() for p in m.parameters()) == pytest.approx(1.24e6, rel=0.01)
    x = torch.rand(2, 3, 32, 32)
    assert m.forward_features(x).shape == (2, 256) and m(x).shape == (2, 10)
    assert m.conv1.kernel_size == (7, 7) and m.conv1.stride == (2, 2)


def test_fedicon_cnn_and_digits_cnn_shapes():
    assert build_model("cnn2")(torch.rand(3, 3, 32, 32)).shape == (3, 10)
    assert build_model("digits_cnn")(torch.rand(3, 3, 16, 16)).shape == (3, 10)
    with pytest.raises(ValueError, match="unknown architecture"):
        build_model("vgg")


def test_augmentation_is_seeded_and_shape_preserving():
    x = torch.rand(6, 3, 8, 8)
    a = augment_batch(x, torch_generator(0, "aug"), 2, True)
    b = augment_batch(x, torch_generator(0, "aug"), 2, True)
    assert a.shape == x.shape and torch.equal(a, b)


def test_training_is_reproducible_and_learns():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 64)
    images = np.zeros((64, 16, 16, 3), np.uint8)
    images[labels == 1, :, :8] = 255  # a learnable pattern
    data = ImageArray("toy", images, labels.astype(np.int64), ["a", "b"])
    spec = SourceSpec("toy", "digits_cnn", "toy", epochs=15, batch_size=16, lr=0.05, flip=False, crop_padding=0)
    m1 = train_model(spec, data, seed=3, progress=False)
    m2 = train_model(spec, data, seed=3, progress=False)
    for p1, p2 in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(p1, p2)
    x, y = data.tensors()
    assert (m1(x).argmax(1) == y).float().mean() > 0.9


@pytest.mark.parametrize("name", ["digits_cnn_embedded", "resnet8_cifar10"])
def test_committed_checkpoints_load_with_cards(name):
    import json
    from ftta_core.training import CHECKPOINT_DIR

    if not (CHECKPOINT_DIR / f"{name}.pt").exists():
        pytest.skip(f"{name} not trained yet")
    m = load_source_model(name)
    card = json.loads((CHECKPOINT_DIR / f"{name}.json").read_text())
    assert card["clean_test_accuracy"] > 80 and card["spec"]["arch"] == SOURCE_MODELS[name].arch
    assert "command" in card
    with pytest.raises(FileNotFoundError, match="train-source"):
        load_source_model("not_a_model")


def test_channels_last_max_pool_equals_the_plain_layer_values_and_gradients():
    from ftta_core.models.ops import MaxPool2d

    x = torch.randn(6, 5, 15, 15, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ours, plain = MaxPool2d(3, 2, 1)(x), torch.nn.MaxPool2d(3, 2, 1)(x)
    assert torch.equal(ours, plain) and ours.is_contiguous()
    g_ours, = torch.autograd.grad(ours.square().sum(), x)
    g_plain, = torch.autograd.grad(plain.square().sum(), x)
    assert torch.equal(g_ours, g_plain)


def test_every_registered_source_model_with_a_card_is_retrained_by_its_recipe():
    """A registered model's card was made by the recipe the registry holds (spec and number of training images), so
    ``train-source --model NAME`` remakes the committed checkpoint."""
    import dataclasses
    import json
    from ftta_core.training import CHECKPOINT_DIR, SOURCE_TRAIN_IMAGES

    carded = [n for n in SOURCE_MODELS if (CHECKPOINT_DIR / f"{n}.json").exists()]
    assert "resnet8_cifar10_e1_n10000" in carded
    for name in carded:
        card = json.loads((CHECKPOINT_DIR / f"{name}.json").read_text())
        assert card["spec"] == json.loads(json.dumps(dataclasses.asdict(SOURCE_MODELS[name]))), name
        if name in SOURCE_TRAIN_IMAGES:
            assert card["train_images"] == SOURCE_TRAIN_IMAGES[name], name


def test_source_model_line_reads_the_card():
    from ftta_core.training import source_model_line

    line = source_model_line("resnet8_cifar10_e1_n10000")
    assert line.startswith("Source model: `resnet8_cifar10_e1_n10000` (resnet8, 1 epoch on cifar10 on 10,000 training")
    assert "clean 46.63%" in line and "37.56% on the 15 corruptions" in line
    assert "no card" in source_model_line("not_a_model")


def test_a_cards_published_reference_is_the_papers_number_and_survives_retraining(tmp_path):
    """The library holds no paper number: the model card carries the one it is compared with (FedTSA's No-Adapt),
    which must equal the paper table the studies read, and a retrained model's card keeps it."""
    import json

    from ftta_core.training import CHECKPOINT_DIR, SOURCE_MODELS, load_source_model, render_cards, save_checkpoint
    from studies.paper import paper_table

    card = json.loads((CHECKPOINT_DIR / "resnet8_cifar10.json").read_text())
    t1 = paper_table("fedtsa_table1")
    no_adapt = t1[(t1.dataset == "cifar10") & (t1.method == "No-Adapt")]["mean"]
    assert card["reference"]["corrupted_mean_accuracy_severity5"] == pytest.approx(float(no_adapt.mean()))
    spec = SOURCE_MODELS["resnet8_cifar10"]
    model = load_source_model("resnet8_cifar10")
    save_checkpoint(model, spec, card, tmp_path)
    save_checkpoint(model, spec, {k: v for k, v in card.items() if k != "reference"}, tmp_path)  # retrained
    assert json.loads((tmp_path / "resnet8_cifar10.json").read_text())["reference"] == card["reference"]
    assert f"{card['reference']['source']}: 35.19%" in render_cards(tmp_path)
