"""SelectiveBackprop: train on the examples with the highest loss. Method card: api/method_cards/selective_backprop.md."""

from algorithms.selective_backprop.selective_backprop import (SelectiveBackprop, per_example_loss, select_using_loss,
                                                              should_select, should_selective_backprop)

__all__ = ["SelectiveBackprop", "per_example_loss", "select_using_loss", "should_select",
           "should_selective_backprop"]
