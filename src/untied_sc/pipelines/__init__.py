from .loading import load_pipeline
from .outputs import DenoisingOutput, DenoisingStep, LanguageFlowPipelineOutput
from .pipeline_elf import ELFPipeline, mask_after_eos
from .pipeline_elf_text2text import ELFText2TextPipeline, SourceConditioning
from .pipeline_flowmap import FlowMapPipeline, convert_flowmap_pipeline
from .pipeline_langflow import LangFlowPipeline
from .pipeline_utils import LanguageFlowPipeline
