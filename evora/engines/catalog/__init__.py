"""The engines, one declaration each (`register_engine`); `evora.engines` imports every module
here, so a declaration names its engine's class by "module:Class" and imports nothing heavy."""
