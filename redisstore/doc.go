// Package redisstore keeps a runbudget budget in Redis, so that every host of
// a run draws on one shared budget, and provides a Redis-backed rate check for
// the admission package.
//
// All state changes happen inside Lua scripts from package luascripts, each
// one atomic step that reads Redis TIME once; no client clock is trusted.
package redisstore
