"""FedAcross+ (k-shot adaptation module, prototypes, stream sampling): model, pre-training, clients, sampling, study.

Flower deployment: ``ftta_core.flower`` (FedAcross+ ServerApp/ClientApp and the generic engine adapter).
"""
from .client import (ClientResult, ClientSpec, EarlyStop, TrainLog, accuracy, adapt_client, augmented_features,
                     backbone_features, embed_features, freeze_for_client, holdout_split, merge_adapters, predict,
                     run_client, train_adapter)
from .model import FedAcrossNet, ModelSpec, adapter_names, adapter_state, count_parameters, load_adapter
from .pretrain import (CHECKPOINT_DIR, RECIPES, PretrainSpec, build_model, classifier_accuracy, load_fedacross,
                       pretrain_server, save_fedacross, train_recipe, untrained_fedacross)
from .prototypes import Prototypes, class_prototypes, nearest_prototype, prototype_distances
from .sampling import (SELECTIONS, VolumeSampler, balanced_select, random_select, sherman_morrison, vessal_select,
                       vessal_select_per_class)

__all__ = ["CHECKPOINT_DIR", "ClientResult", "ClientSpec", "EarlyStop", "FedAcrossNet", "ModelSpec", "PretrainSpec",
           "Prototypes", "RECIPES", "SELECTIONS", "TrainLog", "VolumeSampler", "accuracy", "adapt_client",
           "adapter_names", "adapter_state", "augmented_features", "backbone_features", "balanced_select",
           "build_model", "class_prototypes", "classifier_accuracy", "count_parameters", "embed_features",
           "freeze_for_client", "holdout_split", "load_adapter", "load_fedacross", "merge_adapters",
           "nearest_prototype", "predict", "pretrain_server", "prototype_distances", "random_select", "run_client",
           "save_fedacross", "sherman_morrison", "train_adapter", "train_recipe", "untrained_fedacross",
           "vessal_select", "vessal_select_per_class"]
