"""FedICON (Tan et al., KDD FL workshop 2023): federated contrastive training that tames inter-client
heterogeneity, then contrastive test-time adaptation on each client (no public code; built from the paper).

Modules: ``losses`` (eq. 2-3, 5), ``models`` (two-layer CNN, its BN variant, ResNet-18), ``data`` (the clients of
each test-time shift on the data available here), ``training`` (Algorithm 1, eq. 4, the classifier phase, FL
baselines), ``adaptation`` (contrastive TTA, Tent, EATA, T3A), ``fedthe`` (the FedTHE/FedTHE+ baseline: two heads,
test-time head ensemble), ``study`` (methods, cached results, tables).
"""
from .adaptation import TTAConfig, accuracy, contrastive_tta, eata_predict, predict, t3a_predict, tent_predict
from .data import (ClientData, cifar_label_skew_clients, corrupt_mixed, digit_covariate_clients, digit_lodo_clients,
                   office_covariate_clients, office_lodo_clients)
from .fedthe import FedTHEConfig, TwoHeadModel, fedthe_train, the_predict
from .losses import ntxent_loss, supcon_loss
from .models import encoder_names, head_names, make_model
from .study import METHODS, TABLE1_METHODS, Study, ablation_name, method_table, run_methods
from .training import (TrainConfig, aggregation_weights, average_states, federated_train, fine_tune, local_update,
                       train_classifier)

__all__ = [
    "TTAConfig", "accuracy", "contrastive_tta", "eata_predict", "predict", "t3a_predict", "tent_predict",
    "ClientData", "cifar_label_skew_clients", "corrupt_mixed", "digit_covariate_clients", "digit_lodo_clients",
    "office_covariate_clients", "office_lodo_clients", "FedTHEConfig", "TwoHeadModel", "fedthe_train", "the_predict", "ntxent_loss",
    "supcon_loss", "encoder_names", "head_names", "make_model",
    "METHODS", "TABLE1_METHODS", "Study", "ablation_name", "method_table", "run_methods",
    "TrainConfig", "aggregation_weights", "average_states", "federated_train", "fine_tune", "local_update",
    "train_classifier",
]
