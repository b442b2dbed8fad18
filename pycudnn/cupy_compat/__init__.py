"""Drop-in replacements for CuPy 13's ``cupyx.cudnn`` (removed in CuPy 14).

Code written for CuPy 13 keeps working by changing one import::

    from cupyx import cudnn                      # CuPy <= 13
    from pycudnn import cupy_compat as cudnn     # CuPy 14 + pycudnn

Every function keeps CuPy 13's name, parameters, defaults and semantics (results written into
the caller's preallocated ``y`` or ``gW``, nothing returned), runs on the current stream of the
framework the data array comes from (`pycudnn.current_stream()`), and accepts any array pycudnn
accepts, without copies. What differs only widens what is accepted: non-contiguous arrays,
bfloat16, and errors that name the bad argument. The mapping of each parameter
(``auto_tune``, ``tensor_core``, the layouts, the workspace) is in the guide Migrating from CuPy 13.
The modules: `convolution`, `operations` (activation, softmax, pooling), `normalization`,
`dropout`, and `arrays` (what they share: tensor formats, views, streams, results).
"""

from ..ffi import sublibraries as _sublibraries

_sublibraries.start()  # cuDNN's sub-libraries open while these modules import

from . import convolution, dropout, normalization, operations
from .arrays import CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC
# each module's __all__ is the list of its names
from .convolution import *
from .dropout import *
from .normalization import *
from .operations import *

__all__ = (convolution.__all__ + ["CUDNN_TENSOR_NCHW", "CUDNN_TENSOR_NHWC"] + operations.__all__
           + normalization.__all__ + dropout.__all__)
