"""What a model is: its family (timm ViT, GPT-2) as data, its weights and their sources, its
components over the parameter names, and the check before any trial builds it."""
