"""Public Keras layers of tflm (all registered under the "tflm" serialization package)."""

from tflm.layers.embedding import TiedEmbedding
from tflm.layers.low_rank import LowRankProjection
from tflm.layers.head import LogProbHead
from tflm.layers.candidate_sampler import CandidateSampler
from tflm.layers.softmax import SoftmaxLayer
from tflm.layers.dropout import EmbeddingDropout, LockedDropout, StreamDropout
from tflm.layers.noise import EmbeddingNoise
from tflm.layers.past_decode import PastDecode
from tflm.layers.frage import FrageAdversary, FrageMoments
from tflm.layers.spectral_embedding import SpectralEmbedding
from tflm.layers.lstm import WeightDropLSTM
from tflm.layers.mogrifier import MogrifierLSTM
from tflm.layers.gss import GSSActivation, GSSHead, SigSoftmax
from tflm.layers.plif import PLIFHead, PLIFLayer, learning_rate_multipliers
from tflm.layers.mos import MoCLayer, MoSLayer
from tflm.layers.mixtape import MixtapeLayer
from tflm.layers.doc import DOCLayer
from tflm.layers.neural_ode import NeuralODELogits
from tflm.layers.cnf import CNFHead
from tflm.layers.conditional_cnf import ConditionalCNFHead
