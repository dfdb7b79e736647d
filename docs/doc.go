// Package docs holds kvctl's prose documents and the tests that keep them true: a document
// that names tests or fixtures fails its test when one of them no longer exists.
package docs
