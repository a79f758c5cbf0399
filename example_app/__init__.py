"""The rubris_asgi demo: a simulated market served to browsers and programs."""
