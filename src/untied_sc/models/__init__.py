from .convert import (
    UnsafeCheckpointError,
    convert_official_elf,
    convert_official_langflow,
    load_official_elf,
    load_official_langflow,
)
from .elf_transformer import ELF_PRESETS, ELFTransformerModel, ELFTransformerOutput
from .langflow_transformer import LangFlowTransformerModel, LangFlowTransformerOutput
