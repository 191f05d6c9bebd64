"""Neural-network families: convolution and pooling, normalization, attention, resampling, backward ops, the
chunked linear cross entropy, and distances with embedding bags."""
from . import attention, backward, conv_pool, distance, linear_cross_entropy, normalization, resampling  # noqa: F401
