"""WeightStandardization: standardize convolution weights per filter. Method card: api/method_cards/weight_standardization.md."""

from algorithms.weight_standardization.weight_standardization import (WeightStandardization, WeightStandardizer,
                                                                      apply_weight_standardization, standardize_weights)

__all__ = ["WeightStandardization", "WeightStandardizer", "apply_weight_standardization", "standardize_weights"]
