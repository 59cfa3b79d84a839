package main

import sfengine "github.com/sheepfold/sheepfold/internal/engine"

// engine is the sandbox engine on this host (internal/engine).
type engine = sfengine.Engine

// openEngine starts the runtime (as instance) and the sandbox manager;
// see engine.Open.
var openEngine = sfengine.Open
