// Solves one reCAPTCHA v2 with the official CapMonster Cloud client,
// unchanged, and prints the token as JSON. Key from PINGBACK_API_KEY. The
// client's public Solve parameter sets its polling times: a first poll
// after 5 s (as anti-captcha's client does) so that, in the test, the
// plugin's own poll comes first.
'use strict';
const { CapMonsterCloudClientFactory, ClientOptions, RecaptchaV2Request } = require('@zennolab_com/capmonstercloud-client');

const client = CapMonsterCloudClientFactory.Create(new ClientOptions({ clientKey: process.env.PINGBACK_API_KEY }));
const request = new RecaptchaV2Request({
  websiteURL: 'https://a.example/login',
  websiteKey: '6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-',
});
client.Solve(request, { firstRequestDelay: 5000, requestsInterval: 3000, timeout: 60000 })
  .then((result) => {
    if (result.error || !result.solution) {
      console.error('CapMonster client failed:', result.error);
      process.exit(1);
    }
    console.log(JSON.stringify({ token: result.solution.gRecaptchaResponse }));
  })
  .catch((err) => {
    console.error('CapMonster client failed:', err);
    process.exit(1);
  });
