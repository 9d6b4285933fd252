// Package layering holds the repository's structural checks as tests: the
// import layers of pkg/ (see docs/design.md, "Layers of the library") and
// that every document the code cites is in the repository.
package layering
