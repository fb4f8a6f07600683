"""Scenarios: the FedTSA maps, TH/SH definitions, client pools and Dirichlet label skew."""
import numpy as np
import pytest

from ftta_core.scenarios import (client_image_pools, cluster_offsets, dirichlet_client_pools, explicit_scenario,
                                 fedctta_scenario, fedtsa_scenario, heterogeneity_scenario)

NAMES = [f"c{i}" for i in range(15)]


def test_fedtsa_niid_is_the_4area_cyclic_map():
    sc = fedtsa_scenario(NAMES, niid=True)
    assert sc.domain_map.shape == (20, 15) and sc.slot_steps == 50 and sc.n_steps == 750 and sc.batch_size == 10
    starts = sc.domain_map[:, 0]
    assert list(starts) == [0] * 5 + [4] * 5 + [8] * 5 + [12] * 5
    for row in sc.domain_map:  # each row a cyclic shift of 0..14
        assert sorted(row) == list(range(15))
        assert all((row[k + 1] - row[k]) % 15 == 1 for k in range(14))
    assert sc.spatial_heterogeneity(0) == pytest.approx(0.2)
    assert sc.temporal_heterogeneity == pytest.approx(0.02)  # the label the paper gives this protocol


def test_fedtsa_iid_same_order_for_all():
    sc = fedtsa_scenario(NAMES, niid=False)
    assert (sc.domain_map == np.arange(15)[None]).all()
    assert sc.spatial_heterogeneity(3) == pytest.approx(1 / 20)


@pytest.mark.parametrize("n,sh,th", [(20, 0.2, 0.02), (10, 0.5, 0.1), (20, 0.75, 1 / 15), (12, 1 / 12, 1.0)])
def test_any_sh_th(n, sh, th):
    sc = heterogeneity_scenario(n, NAMES, sh, th, n_steps=750, batch_size=10)
    assert sc.slot_steps == max(1, round(1 / th))
    assert sc.temporal_heterogeneity == pytest.approx(1 / sc.slot_steps)
    for s in range(sc.n_slots):
        assert len(np.unique(sc.domain_map[:, s])) == round(sh * n)
    assert sc.spatial_heterogeneity(0) == pytest.approx(round(sh * n) / n)


def test_cluster_offsets_distinct_and_4area():
    assert list(cluster_offsets(4, 15)) == [0, 4, 8, 12]
    for k in range(1, 16):
        assert len(set(cluster_offsets(k, 15) % 15)) == k
    with pytest.raises(ValueError, match="clusters"):
        cluster_offsets(16, 15)


def test_invalid_values_name_the_field():
    with pytest.raises(ValueError, match="sh"):
        heterogeneity_scenario(10, NAMES, 0.0, 0.1, 100, 10)
    with pytest.raises(ValueError, match="th"):
        heterogeneity_scenario(10, NAMES, 0.2, 1.5, 100, 10)
    with pytest.raises(ValueError, match="domain_map"):
        explicit_scenario([[0, 99]], NAMES, 5, 10)
    with pytest.raises(ValueError, match="slot_steps"):
        fedtsa_scenario(NAMES, slot_steps=7)


def test_pools_are_disjoint_and_reproducible():
    a = client_image_pools(10000, 20, 500, seed=3)
    assert a.shape == (20, 500) and len(np.unique(a)) == 10000
    assert (a == client_image_pools(10000, 20, 500, seed=3)).all()
    assert not (a == client_image_pools(10000, 20, 500, seed=4)).all()


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = np.repeat(np.arange(10), 1000)

    def mean_max_share(alpha):
        pools = dirichlet_client_pools(labels, 10, 200, alpha, seed=0)
        return np.mean([np.bincount(labels[p], minlength=10).max() / 200 for p in pools])

    iid, mild, strong = mean_max_share(None), mean_max_share(1.0), mean_max_share(0.01)
    assert iid < 0.2 < mild < strong and strong > 0.9
    a = dirichlet_client_pools(labels, 10, 200, 0.1, seed=1)
    assert (a == dirichlet_client_pools(labels, 10, 200, 0.1, seed=1)).all()
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_client_pools(labels, 10, 200, -1.0, seed=1)


def test_fedctta_niid_reshuffles_clients_round_robin():
    sc = fedctta_scenario(NAMES, niid=True)
    assert sc.domain_map.shape == (20, 15)
    for s in range(sc.n_slots):
        assert len(np.unique(sc.domain_map[:, s])) == 4  # SH = 0.2 at every slot
    # groups {i = r mod 4} stay together, hopping to another area's sequence every slot
    for s in range(sc.n_slots):
        assert set(np.flatnonzero(sc.domain_map[:, s] == sc.domain_map[0, s])) == {0, 4, 8, 12, 16}
    row = sc.domain_map[0]
    assert not all((row[k + 1] - row[k]) % 15 == 1 for k in range(14))  # not a cyclic walk
    assert (fedctta_scenario(NAMES, niid=False).domain_map == fedtsa_scenario(NAMES, niid=False).domain_map).all()


def test_case_study_groups_follow_the_papers_orders():
    from ftta_core.scenarios import case_study_scenario

    names = [f"d{i}" for i in range(15)]
    sc = case_study_scenario(names, batch_size=10, images_per_domain=500)
    slots = sc.domain_map  # [10 clients, 15 slots]
    assert slots.shape == (10, 15)
    assert (slots[:4] == np.arange(15)).all()
    assert (slots[4:7] == (np.arange(15) + 1) % 15).all()
    assert (slots[7:] == np.arange(15)[::-1]).all()
    assert slots[0, 7] == slots[9, 7] == 7  # group 3 meets group 1 on the middle domain


def test_fedctta_case_study_starts_group_2_four_corruptions_ahead():
    from ftta_core.corruptions import CORRUPTIONS
    from ftta_core.experiment import ExperimentConfig, build_scenario

    cfg = ExperimentConfig(dataset="cifar10", scenario="case_study_fedctta", clients=10, batch_size=10,
                           images_per_client=500)
    sc = build_scenario(cfg)
    names = [CORRUPTIONS[d] for d in sc.domain_map[4]]
    assert names[:3] == ["glass_blur", "motion_blur", "zoom_blur"] and names[-1] == "defocus_blur"  # Table III row 2
    assert [CORRUPTIONS[d] for d in sc.domain_map[9, :2]] == ["jpeg_compression", "pixelate"]
    with pytest.raises(ValueError, match="'clients'"):
        ExperimentConfig(scenario="case_study_fedctta", clients=8)


def test_case_study_config_needs_ten_clients():
    from ftta_core.experiment import ExperimentConfig

    with pytest.raises(ValueError, match="'clients'"):
        ExperimentConfig(scenario="case_study", clients=8)


def test_th_002_is_the_table1_protocol_of_50_step_slots():
    sc = heterogeneity_scenario(20, NAMES, 0.2, 0.02, n_steps=750, batch_size=10)
    ref = fedtsa_scenario(NAMES, niid=True)
    assert sc.slot_steps == ref.slot_steps == 50
    assert sc.n_slots == ref.n_slots == 15
