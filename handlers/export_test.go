package handlers

// MaxResolutionBody is the admin API's limit on a resolution's or a
// replay's body, for the tests that judge what a body over it is told.
const MaxResolutionBody = maxResolutionBody
