from .convert import (
    UnsafeCheckpointError,
    convert_official_elf,
    convert_official_langflow,
    load_official_elf,
    load_official_langflow,
)
from .elf_transformer import ELF_PRESETS, ELFTransformerModel, ELFTransformerOutput
from .flowmap_transformer import (
    FlowMapTransformerModel,
    FlowMapTransformerOutput,
    convert_official_flowmap,
    load_official_flowmap,
)
from .langflow_transformer import LangFlowTransformerModel, LangFlowTransformerOutput
